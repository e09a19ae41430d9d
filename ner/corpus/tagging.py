"""Tag a corpus into a folder: streamed, in fixed chunks, resumable, in input order, over any number of processes.

    python -m ner.predict runs/ner/final corpus/*.txt --output-dir tagged --merge     # raw text, a text a line
    python -m ner.predict runs/ner/final docs.jsonl --jsonl --output-dir tagged       # span JSONL, fields kept
    python -m ner.predict runs/ner/final shards/ --text-column body --output-dir tagged   # parquet / datasets folder
    torchrun --nproc_per_node 4 -m ner.predict runs/ner/final corpus/ --output-dir tagged --merge
    accelerate launch --num_processes 4 -m ner.predict runs/ner/final corpus/ --output-dir tagged
    torchrun --nnodes 2 --nproc_per_node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m ner.predict ...

The input is read lazily and cut into chunks of --chunk-texts texts (never dependent on the number of
processes); the chunks not yet done are dealt round-robin to the processes, each of which holds one model
copy on its own device. Chunk k is written whole or not at all (ner/files.py) as OUT/part-<k>.jsonl, one
line per input text in input order, each with its "_source" (`file:line`, or `file#row` for parquet and
datasets rows). OUT/manifest.json records the model (its files' SHA-256), the settings, how the numbers are
computed (runtime, precision used, device type, CPU threads, decoding, window, batch budget) and the input
(paths, sizes, modification times, texts per file). Rerunning the same command in the same environment skips
finished parts and writes byte-identical output; anything the manifest pins that differs is refused, naming
each difference and its old value (--overwrite removes what this tool wrote there and starts again); the
number of processes is free. An error in any process reaches all of them and is printed once, by rank 0.
--merge: rank 0 concatenates the parts into OUT/predictions.jsonl once every part exists. OUT must be a
folder every process (and node) sees.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ner.data.examples import Example
from ner.data.spans import entities_record, text_of
from ner.errors import UserError, report
from ner.files import atomic_write_text, sha256_file, staged_file

MANIFEST, MERGED = "manifest.json", "predictions.jsonl"
MANIFEST_VERSION = 2  # 2: the computation (precision, device, threads, ...) is pinned
PART = re.compile(r"part-(\d{5,})\.jsonl")
# ner/files.py names its temporary files `.NAME.tmp-<8 hex>SUFFIX`: ours beyond doubt when NAME is ours
OUR_TEMP = re.compile(r"\.(part-\d{5,}\.jsonl|manifest\.json|predictions\.jsonl)\.tmp-[0-9a-f]{8}\.(jsonl|json)")
# --chunk-texts auto: about CHUNKS_AIMED_FOR chunks of the corpus, within CHUNK_TEXTS_RANGE (docs/corpus.md:
# chunks dealt round-robin balance processes only when each gets several, and every chunk costs a part-filled
# forward per batch width, about 0.5-0.8 s on 2 CPU cores, so small chunks are slow)
CHUNKS_AIMED_FOR, CHUNK_TEXTS_RANGE = 16, (2048, 4096)
DEFAULT_CHUNK_TEXTS = CHUNK_TEXTS_RANGE[1]  # Ray Data's batch size (RayTagger)
READ_BLOCK_BYTES = 1 << 20
Unit = tuple[str, str, object]  # (kind, where, payload): a text as read, parsed only where it is tagged


def part_name(chunk: int) -> str:
    return f"part-{chunk:05d}.jsonl"


def chunk_texts_arg(value: str) -> int | None:
    """--chunk-texts: a count, or auto (None)."""
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of texts or auto, got {value!r}") from None


def chunk_texts_for(requested: int | None, texts: int) -> int:
    """The chunk size: as given, or for auto one from the corpus size alone (never from the number of processes,
    so every run over the same input cuts the same chunks): about CHUNKS_AIMED_FOR, within CHUNK_TEXTS_RANGE."""
    if requested is not None:
        return requested
    low, high = CHUNK_TEXTS_RANGE
    return max(low, min(high, -(-texts // CHUNKS_AIMED_FOR)))


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Source:
    """One input file (or datasets folder): `name` as the user's arguments spell it, `kind` how it is read."""

    name: str
    kind: str  # text | jsonl | parquet | dataset

    @property
    def path(self) -> Path:
        return Path(self.name)

    def files(self) -> list[Path]:
        if self.kind != "dataset":
            return [self.path]
        return sorted(p for p in self.path.iterdir() if p.is_file() and not p.name.startswith("."))


def _kind(path: Path, jsonl: bool) -> str:
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise UserError(f"{path}: a datasets DatasetDict; pass one split's folder ({', '.join(splits)})")
        return "dataset"
    if path.suffix == ".parquet":
        return "parquet"
    return "jsonl" if jsonl else "text"


def _is_dataset_folder(path: Path) -> bool:
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _inside(path: Path, out_dir: Path) -> bool:
    """Whether `path` is the resolved `out_dir` or under it, however it is spelt (relative, `..`, links)."""
    resolved = path.resolve()
    return resolved == out_dir or out_dir in resolved.parents


def _folder_files(folder: Path, out_dir: Path) -> list[Path]:
    """A folder's files, sorted by path, hidden ones and the output folder's left out."""
    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).parts
        if path.is_file() and not any(part.startswith(".") for part in relative) and not _inside(path, out_dir):
            found.append(path)
    return found


def expand_inputs(inputs: list[str], jsonl: bool, out_dir: Path) -> list[Source]:
    """Files, globs and folders, in the order given; a glob's or folder's files sorted by path."""
    out_dir = out_dir.resolve()
    sources = []
    for given in inputs:
        path = Path(given)
        if glob.has_magic(given):
            paths = [Path(p) for p in sorted(glob.glob(given, recursive=True))]
            paths = [p for p in paths if (p.is_file() or _is_dataset_folder(p)) and not _inside(p, out_dir)]
            if not paths:
                raise UserError(f"{given}: no file matches (outside --output-dir)")
        elif path.is_dir() and not _is_dataset_folder(path):
            paths = _folder_files(path, out_dir)
            if not paths:
                raise UserError(f"{given}: an empty folder")
        elif path.exists() and _inside(path, out_dir):
            raise UserError(f"{given}: inside --output-dir {out_dir}, where the output goes; choose an input "
                            "outside it")
        elif path.exists():
            paths = [path]
        else:
            raise UserError(f"{given}: file not found")
        sources += [Source(str(p), _kind(p, jsonl)) for p in paths]
    return sources


def _count_lines(path: Path) -> int:
    """Texts in a raw-text file: its \\n-ended lines, plus a last line without one."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(READ_BLOCK_BYTES):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def count_texts(source: Source, text_column: str) -> int:
    """A streaming pass (raw text, JSONL) or the files' metadata (parquet, datasets)."""
    if source.kind == "text":
        return _count_lines(source.path)
    if source.kind == "jsonl":
        with open(source.path, "rb") as handle:
            return sum(1 for line in handle if line.strip())
    return len(_open_table(source, text_column))


class _ParquetColumn:
    def __init__(self, path: Path, column: str) -> None:
        import pyarrow.parquet as pq

        self.file = pq.ParquetFile(path)
        if column not in self.file.schema_arrow.names:
            raise UserError(f"{path}: no column {column!r} (it has {', '.join(self.file.schema_arrow.names)}); "
                            "pass --text-column")
        self.column = column

    def __len__(self) -> int:
        return self.file.metadata.num_rows

    def __iter__(self) -> Iterator[object]:
        for batch in self.file.iter_batches(batch_size=1024, columns=[self.column]):
            yield from batch.column(0).to_pylist()


class _DatasetColumn:
    def __init__(self, path: Path, column: str) -> None:
        import datasets

        datasets.disable_progress_bars()
        self.dataset = datasets.load_from_disk(str(path))  # memory-mapped Arrow: nothing read yet
        if column not in self.dataset.column_names:
            raise UserError(f"{path}: no column {column!r} (it has {', '.join(self.dataset.column_names)}); "
                            "pass --text-column")
        self.column = column

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[object]:
        for batch in self.dataset.select_columns([self.column]).iter(batch_size=1024):
            yield from batch[self.column]


def _open_table(source: Source, column: str):
    return (_ParquetColumn if source.kind == "parquet" else _DatasetColumn)(source.path, column)


def _file_lines(source: Source) -> Iterator[tuple[str, str, bytes]]:
    with open(source.path, "rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if source.kind == "jsonl" and not line.strip():
                continue
            if line_no == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            line = line[:-1] if line.endswith(b"\n") else line
            yield source.kind, f"{source.name}:{line_no}", line[:-1] if line.endswith(b"\r") else line


def iter_units(sources: list[Source], text_column: str) -> Iterator[Unit]:
    """(kind, where, payload) for every text in input order, read lazily: a raw line (bytes, parsed only when its
    chunk is tagged here) or a table cell."""
    for source in sources:
        if source.kind in ("text", "jsonl"):
            yield from _file_lines(source)
        else:
            for row, value in enumerate(_open_table(source, text_column)):
                yield source.kind, f"{source.name}#{row}", value


def parse_unit(kind: str, where: str, payload: object) -> dict:
    """A text's record ({"text": ...} plus, for JSONL, its other fields); a bad one names its file and line."""
    if isinstance(payload, bytes):
        try:
            line = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{where}: not UTF-8 text; re-save it as UTF-8") from None
        if kind == "text":
            return {"text": line}
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: not valid JSON ({exc.msg}); expected a JSON object with a \"text\"") from None
        text_of(record, where)
        return record
    if not isinstance(payload, str):
        raise UserError(f"{where}: the text column holds {type(payload).__name__}, not a string")
    return {"text": payload}


# ----------------------------------------------------------------------------- manifest


def file_identity(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def model_identity(model_dir: Path, runtime: str) -> dict:
    """The files that decide the model's answers: weights, config, tokenizer, training_args.json. The model
    card (README.md) and ONNX files another runtime reads are left out."""
    from ner.inference.runtime import ONNX_FILES

    if not (model_dir / "config.json").is_file():
        raise UserError(f"{model_dir}: not a model folder (no config.json); pass OUTPUT_DIR/final")
    unused = {name for key, name in ONNX_FILES.items() if key != runtime}
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".")
                   and p.name != "README.md" and p.name not in unused)
    return {"path": str(model_dir.resolve()), "sha256": {p.name: sha256_file(p) for p in files}}


def corpus_settings(args: argparse.Namespace) -> dict:
    """The options that decide what a part holds and how its lines are written (--chunk-texts: which texts)."""
    return {"format": args.format, "jsonl": args.jsonl, "text_column": args.text_column,
            "chunk_texts": "auto" if args.chunk_texts is None else args.chunk_texts}


def computation(tagger, args: argparse.Namespace) -> dict:
    """How this process computes the numbers, as its loaded Tagger does: the rest of what changes the output
    bytes besides the model files. Threads count where the passes run on the CPU (a different count sums
    in another order); the batch budget decides the padded shapes."""
    runs_on = tagger.runtime.device_type
    one_text = [Example([], [], "<text>", document=0)]  # each text is a document (Tagger.predict)
    return {"runtime": tagger.runtime_name, "precision": tagger.precision, "device": runs_on,
            "threads": intra_op_threads(tagger.runtime) if runs_on == "cpu" else None,
            "casing": tagger.settings.casing, "context": "document" if tagger.uses_context(one_text) else "none",
            "decode": tagger.decoder.method, "max_seq_length": tagger.max_seq_length,
            "min_score": tagger.min_score or None,
            "batch_size": args.batch_size, "max_tokens": args.max_tokens}


def intra_op_threads(runtime) -> int:
    """The threads one CPU operator uses: the ONNX session's own setting, else torch's."""
    if hasattr(runtime, "session"):
        return runtime.session.get_session_options().intra_op_num_threads
    import torch

    return torch.get_num_threads()


def input_identity(sources: list[Source]) -> list[dict]:
    return [{"name": s.name, "kind": s.kind, "files": [file_identity(p) for p in s.files()]} for s in sources]


def how_to_match(key: str, old: object) -> str | None:
    """What gives a resume the saved value back, where the user can choose it."""
    if key == "threads":
        return f"OMP_NUM_THREADS={old}" if old else None
    if key == "device":
        return f"a {old} device"
    if key == "min_score" and old:
        return "--min-score " + ",".join(f"{kind}={score}" if kind else str(score) for kind, score in old.items())
    if key == "casing" or old is None:
        return None  # casing is the model's (training_args.json); None: the default, so no option to pass
    flag = "--mixed-precision" if key == "precision" else "--" + key.replace("_", "-")
    if isinstance(old, bool):
        return flag if old else f"no {flag}"
    return f"{flag} {old}"


def setting_differences(saved: dict, current: dict) -> tuple[list[str], list[str]]:
    """(each differing option or computation setting, `name: old before, new now`; how to get the old back)."""
    found, fixes = [], []
    for section, prefix in (("settings", "--"), ("computation", "")):
        for key, value in current[section].items():
            old = saved.get(section, {}).get(key)
            if old != value:
                name = prefix + key.replace("_", "-") if prefix else key
                found.append(f"{name}: {old!r} before, {value!r} now")
                fixes += [fix] if (fix := how_to_match(key, old)) else []
    return found, fixes


def input_differences(saved: dict, current: dict) -> list[str]:
    old_inputs = {f["path"]: f for s in saved.get("inputs", []) for f in s["files"]}
    new_inputs = {f["path"]: f for s in current["inputs"] for f in s["files"]}
    found = [f"input {path} no longer given" for path in sorted(old_inputs.keys() - new_inputs.keys())]
    found += [f"input {path} added" for path in sorted(new_inputs.keys() - old_inputs.keys())]
    found += [f"input {path} changed (size or modification time)"
              for path in sorted(old_inputs.keys() & new_inputs.keys()) if old_inputs[path] != new_inputs[path]]
    if not found and [s["name"] for s in saved["inputs"]] != [s["name"] for s in current["inputs"]]:
        found.append("the inputs' order changed")
    return found


def model_differences(saved: dict, current: dict) -> list[str]:
    old, new = saved.get("model", {}).get("sha256", {}), current["model"]["sha256"]
    changed = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
    return [f"model files changed ({', '.join(changed)})"] if changed else []


def check_resumable(out_dir: Path, saved: dict, current: dict) -> None:
    """Refuse a resume whose parts could differ from the finished ones, naming each difference and its fix."""
    if saved.get("version") != MANIFEST_VERSION:
        raise UserError(f"{out_dir / MANIFEST}: manifest version {saved.get('version')!r}, this ner.predict "
                        f"writes version {MANIFEST_VERSION} (it also pins the precision, device and threads the "
                        "parts were computed with); finish that run with the ner.predict that started it, or pass "
                        "--overwrite to start again")
    settings, fixes = setting_differences(saved, current)
    changed = model_differences(saved, current) + settings + input_differences(saved, current)
    if changed:
        how = f" ({', '.join(fixes)})" if fixes else ""
        raise UserError(f"{out_dir}: written by another run ({'; '.join(changed)}); run with that run's model, "
                        f"settings and input{how} to resume, or pass --overwrite to start again (it removes only "
                        f"parts, manifest and {MERGED})")


# ----------------------------------------------------------------------------- the output folder


def ours(name: str) -> bool:
    return name in (MANIFEST, MERGED) or bool(PART.fullmatch(name)) or bool(OUR_TEMP.fullmatch(name))


def remove_ours(out_dir: Path, temporaries_only: bool = False) -> None:
    """Delete what this tool writes in OUT (parts, manifest, merged file, their temporary files); nothing else."""
    for path in out_dir.iterdir():
        if path.is_file() and ours(path.name) and (not temporaries_only or OUR_TEMP.fullmatch(path.name)):
            path.unlink()


def check_folder_is_ours(out_dir: Path) -> dict | None:
    """The manifest of a folder this tool wrote, None for a new or empty folder; another folder is refused."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise UserError(f"{out_dir}: not a folder; --output-dir needs a new or empty folder, or one it wrote")
    manifest = out_dir / MANIFEST
    if manifest.is_file():
        saved = json.loads(manifest.read_text(encoding="utf-8"))
        if saved.get("tool") == "ner.predict":
            return saved
    other = next(iter(sorted(out_dir.iterdir())), None)
    if other is not None:
        raise UserError(f"{other}: --output-dir {out_dir} is not empty and holds no ner.predict manifest; "
                        "pick a new or empty folder (nothing was changed there)")
    return None


def finished_chunks(out_dir: Path) -> set[int]:
    """Parts on disk: each exists only whole (renamed into place after it was written)."""
    return {int(m.group(1)) for p in out_dir.iterdir() if (m := PART.fullmatch(p.name))}


@dataclass(frozen=True)
class Plan:
    texts: int
    chunk_texts: int
    done: frozenset[int]

    @property
    def chunks(self) -> int:
        return -(-self.texts // self.chunk_texts)

    def size(self, chunk: int) -> int:
        return min(self.chunk_texts, self.texts - chunk * self.chunk_texts)

    def mine(self, rank: int, world: int) -> list[int]:
        """The chunks not done, dealt round-robin: balanced on a fresh run and on a resume alike."""
        return [k for k in range(self.chunks) if k not in self.done][rank::world]


def prepare(args: argparse.Namespace, sources: list[Source], computed: dict) -> Plan:
    """Rank 0, before anyone writes: check OUT, refuse a changed run (or start again), count, write the manifest."""
    out_dir: Path = args.output_dir
    saved = check_folder_is_ours(out_dir)
    current = {"tool": "ner.predict", "version": MANIFEST_VERSION,
               "model": model_identity(args.model_dir, args.runtime), "settings": corpus_settings(args),
               "computation": computed, "inputs": input_identity(sources)}
    if saved is not None and args.overwrite:
        remove_ours(out_dir)
        saved = None
    if saved is not None:
        check_resumable(out_dir, saved, current)
        remove_ours(out_dir, temporaries_only=True)  # a killed writer's leftovers; the parts are whole
        chunk_texts = saved.get("chunk_texts") or chunk_texts_for(args.chunk_texts, saved["texts"])
        return Plan(saved["texts"], chunk_texts, frozenset(finished_chunks(out_dir)))
    counts = [count_texts(source, args.text_column) for source in sources]
    for source, count in zip(current["inputs"], counts):
        source["texts"] = count
    current["texts"] = sum(counts)
    current["chunk_texts"] = chunk_texts_for(args.chunk_texts, current["texts"])
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / MANIFEST, json.dumps(current, indent=1) + "\n", fsync=True)
    return Plan(current["texts"], current["chunk_texts"], frozenset())


# ----------------------------------------------------------------------------- tagging


def owned_chunks(sources: list[Source], text_column: str, plan: Plan,
                 mine: list[int]) -> Iterator[tuple[int, list[Unit]]]:
    """(k, units) for this process's chunks, streaming past the others (their lines are never parsed)."""
    wanted = set(mine)
    if not wanted:
        return
    units = iter_units(sources, text_column)
    for k in range(max(wanted) + 1):
        chunk = list(itertools.islice(units, plan.size(k))) if k in wanted else None
        if chunk is None:
            for _ in itertools.islice(units, plan.size(k)):
                pass
            continue
        yield k, chunk


def output_line(record: dict, where: str, found: list[dict], spans: bool, raw_text: bool) -> str:
    if spans:
        out = entities_record(record, found)
    elif raw_text:
        out = {"entities": found}
    else:  # the record's other fields kept, its spans replaced by the predicted entities
        out = {**entities_record(record, found), "entities": found}
    return json.dumps({"_source": where, **out}, ensure_ascii=False) + "\n"


def tag_chunk(tagger, args: argparse.Namespace, units: list[Unit]) -> str:
    """A chunk's output; every line is parsed before anything is tagged, so a bad one writes nothing."""
    records = [parse_unit(kind, where, payload) for kind, where, payload in units]
    results = tagger.predict([r["text"] for r in records], args.batch_size, args.max_tokens)
    return "".join(output_line(record, where, result["entities"], args.format == "spans", not args.jsonl)
                   for (_, where, _), record, result in zip(units, records, results))


class Progress:
    """Rank 0's view of every process's work: the parts on disk (OUT is shared), read after each of its chunks."""

    def __init__(self, out_dir: Path, plan: Plan, world: int, quiet: bool) -> None:
        self.out_dir, self.plan, self.world, self.quiet = out_dir, plan, world, quiet
        self.start_s, self.start_texts = time.monotonic(), self.done_texts()

    def done_texts(self) -> int:
        return sum(self.plan.size(k) for k in finished_chunks(self.out_dir) if k < self.plan.chunks)

    def line(self) -> str:
        done = self.done_texts()
        rate = (done - self.start_texts) / max(time.monotonic() - self.start_s, 1e-9)
        eta = (self.plan.texts - done) / rate if rate > 0 else float("nan")
        return (f"corpus: {done:,}/{self.plan.texts:,} texts ({100 * done / max(self.plan.texts, 1):.1f}%), "
                f"{rate:,.1f} texts/s over {self.world} process{'es' if self.world > 1 else ''}, "
                f"ETA {_duration(eta)}")

    def report(self) -> None:
        if not self.quiet:
            print(self.line(), file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    if seconds != seconds:  # nan: nothing measured yet
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def tag_my_chunks(args: argparse.Namespace, backend, tagger, sources: list[Source], plan: Plan,
                  progress: Progress) -> None:
    """Tag and write this process's chunks (run inside all_or_none: a failure stops this process only, the
    others finish their chunks, kept for the rerun, before they learn of it)."""
    from ner.testing import inject_fault

    mine = plan.mine(backend.process_index, backend.num_processes)
    for k, units in owned_chunks(sources, args.text_column, plan, mine):
        text = tag_chunk(tagger, args, units)
        inject_fault(k, backend.process_index)  # NER_FAULT_INJECT="kill:CHUNK[:RANK]": a kill inside a chunk
        atomic_write_text(args.output_dir / part_name(k), text, fsync=True)
        progress.report()


def merge_parts(out_dir: Path, plan: Plan) -> Path:
    """OUT/predictions.jsonl: the parts in order, streamed, written whole or not at all."""
    missing = [part_name(k) for k in range(plan.chunks) if not (out_dir / part_name(k)).is_file()]
    if missing:
        raise UserError(f"{out_dir}: cannot merge, {len(missing)} part(s) missing ({missing[0]}, ...); rerun the "
                        "command to tag them")
    with staged_file(out_dir / MERGED, fsync=True) as tmp, open(tmp, "wb") as merged:
        for k in range(plan.chunks):
            with open(out_dir / part_name(k), "rb") as part:
                shutil.copyfileobj(part, merged, READ_BLOCK_BYTES)
    return out_dir / MERGED


def load_tagger(args: argparse.Namespace, backend):
    """This process's model copy on its device; --batch-size / --max-tokens resolved for what runs the passes
    (before the manifest is written, so a resume on another device type is refused, not mixed)."""
    from ner.inference.options import inference_budget
    from ner.inference.tagger import Tagger

    tagger = Tagger(args.model_dir, device=str(backend.device), precision=args.mixed_precision,
                    max_seq_length=args.max_seq_length, context=args.context, decode=args.decode,
                    runtime=args.runtime, min_score=args.min_score)
    args.batch_size, args.max_tokens = inference_budget(tagger.runtime.device_type, args.batch_size,
                                                        args.max_tokens)
    return tagger


def one_line(exc: Exception, backend) -> str:
    """An unexpected exception as the one line every process reports: its type, its first line, and which
    process met it where there are several (a file gone on one node, a device out of memory)."""
    first = next(iter(str(exc).strip().splitlines()), "")
    where = f"process {backend.process_index} of {backend.num_processes}: " if backend.num_processes > 1 else ""
    return f"{where}{type(exc).__name__}" + (f": {first}" if first else "")


@contextmanager
def all_or_none(backend) -> Iterator[None]:
    """Run the block in every process, then meet: a failure in any one (a UserError, or any other exception)
    is raised in every process as the same one-line UserError, the lowest rank's first, so no process waits
    at the next collective for one that has already stopped."""
    error, cause = None, None
    try:
        yield
    except UserError as exc:
        error, cause = str(exc), exc
    except Exception as exc:  # not only ours: a FileNotFoundError or OOM would otherwise leave the others waiting
        error, cause = one_line(exc, backend), exc
    errors = [e for e in backend.gather_object(error) if e]
    if errors:
        raise UserError(errors[0]) from cause


def check_processes_agree(views: list[tuple[list[Source], dict]]) -> None:
    """Every process must read the same inputs and compute the same way, or a part's bytes would depend on
    the process that wrote it; views: (sources, computation) by rank."""
    sources, computed = views[0]
    for rank, (other_sources, other_computed) in enumerate(views[1:], start=1):
        if other_sources != sources:
            raise UserError(f"process {rank} lists other inputs than process 0 ({len(other_sources)} against "
                            f"{len(sources)} files, or other names); give every process the same INPUT paths, on a "
                            "file system all of them see")
        differing = [f"{key}: {computed[key]!r} in process 0, {value!r} in process {rank}"
                     for key, value in other_computed.items() if computed.get(key) != value]
        if differing:
            raise UserError(f"the processes would compute differently ({'; '.join(differing)}); give every "
                            "process the same device type and OMP_NUM_THREADS")


def check_corpus_args(args: argparse.Namespace) -> None:
    if args.pretokenized or args.conll:
        raise UserError("--output-dir tags raw text, --jsonl or parquet/datasets columns; "
                        "--pretokenized and --conll write to stdout")
    if args.format not in ("json", "spans"):
        raise UserError(f"--format {args.format}: --output-dir writes json or spans lines")
    if args.chunk_texts is not None and args.chunk_texts < 1:
        raise UserError(f"--chunk-texts must be at least 1 (got {args.chunk_texts})")
    if not args.inputs:
        raise UserError("--output-dir needs INPUT files, globs or folders (stdin cannot be resumed)")


def tag_corpus(args: argparse.Namespace) -> int:
    """The whole run in every process; an error is printed once, by rank 0, before any process leaves."""
    from ner.backends import inference_backend

    check_corpus_args(args)
    backend = inference_backend(args.dist_timeout)
    try:
        tag_on_every_process(args, backend)
    except UserError as exc:  # raised by every process at once (all_or_none)
        return report_then_leave_together(exc, backend)
    finally:
        backend.end()
    return 0


def report_then_leave_together(exc: UserError, backend) -> int:
    """Rank 0 prints the error, then all leave at once: a launcher stops the other processes as soon as one
    exits, which could otherwise come before rank 0 has printed (torchrun did so here: no error line)."""
    code = report(exc, backend.process_index)
    backend.wait_for_everyone()
    return code


def tag_on_every_process(args: argparse.Namespace, backend) -> None:
    """All list the input and load the model, rank 0 prepares, all tag their chunks, rank 0 merges. Each step
    that can fail ends where every process meets (all_or_none): no UserError may come from one process only."""
    with all_or_none(backend):
        sources = expand_inputs([str(p) for p in args.inputs], args.jsonl, args.output_dir)
        tagger = load_tagger(args, backend)
        computed = computation(tagger, args)
    check_processes_agree(backend.gather_object((sources, computed)))
    plan = None
    with all_or_none(backend):
        if backend.is_main_process:
            plan = prepare(args, sources, computed)
    plan = backend.gather_object(plan)[0]
    if backend.is_main_process and not args.quiet:
        print(f"corpus: {plan.texts:,} texts in {plan.chunks} chunks of {plan.chunk_texts}, "
              f"{len(plan.done)} done already; {backend.num_processes} process(es)", file=sys.stderr, flush=True)
    progress = Progress(args.output_dir, plan, backend.num_processes, args.quiet or not backend.is_main_process)
    with all_or_none(backend):
        tag_my_chunks(args, backend, tagger, sources, plan, progress)
    if backend.num_processes > 1:
        progress.report()  # every process has finished: the last line counts all of them
    with all_or_none(backend):
        if args.merge and backend.is_main_process:
            merged = merge_parts(args.output_dir, plan)
            if not args.quiet:
                print(f"corpus: wrote {merged}", file=sys.stderr, flush=True)


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("corpus tagging (--output-dir; see ner/corpus/tagging.py)")
    group.add_argument("--output-dir", type=Path, default=None,
                       help="tag INPUT... into OUT/part-NNNNN.jsonl (resumable, any number of processes)")
    low, high = CHUNK_TEXTS_RANGE
    group.add_argument("--chunk-texts", type=chunk_texts_arg, default=None, metavar="N|auto",
                       help=f"texts per part (default: auto, about 1/{CHUNKS_AIMED_FOR} of the corpus, {low}-{high})")
    group.add_argument("--merge", action="store_true", help="then concatenate the parts into OUT/" + MERGED)
    group.add_argument("--overwrite", action="store_true",
                       help="start again: remove the parts, manifest and merged file a previous run wrote in OUT")
    group.add_argument("--text-column", default="text", help="parquet / datasets input: the column of texts")
    group.add_argument("--dist-timeout", type=float, default=7200.0,
                       help="seconds a process waits for the others at the start and the end (default: 7200)")


# ----------------------------------------------------------------------------- Ray Data


class RayTagger:
    """A Tagger as the callable class Ray Data's `map_batches` takes for offline batch inference: each actor
    loads the model once, then tags batches of rows; `entities` is added as a JSON string per row (the list
    ner.predict writes), so the column holds one Arrow type whatever is found. Imports no Ray itself.

        ds = ray.data.read_parquet("s3://bucket/corpus/")
        ds = ds.map_batches(RayTagger, fn_constructor_kwargs={"model_dir": "runs/ner/final"},
                            batch_size=DEFAULT_CHUNK_TEXTS, concurrency=4, num_gpus=1)
        ds.write_parquet("s3://bucket/tagged/")
    """

    def __init__(self, model_dir: str, text_column: str = "text", batch_size: int | None = None,
                 max_tokens: int | None = None, **tagger_options) -> None:
        from ner.inference.tagger import Tagger

        self.tagger = Tagger(model_dir, **tagger_options)
        self.text_column = text_column
        self.max_sentences, self.max_tokens = batch_size, max_tokens  # None: the device's default (Tagger.tag)

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        # a missing or non-string text fails its batch with the row named, as the CLI refuses it
        texts = [parse_unit("table", f"{self.text_column} row {row} of this batch", text)["text"]
                 for row, text in enumerate(batch[self.text_column])]
        results = self.tagger.predict(texts, self.max_sentences, self.max_tokens)
        found = [json.dumps(result["entities"], ensure_ascii=False) for result in results]
        return {**batch, "entities": np.array(found, dtype=object)}
