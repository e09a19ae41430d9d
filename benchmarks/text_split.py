"""Word splitting of adversarial text against prose of the same length: no input costs more than its length.

    python -m benchmarks.text_split                          # 100,000 characters each, best of 3
    python -m benchmarks.text_split --chars 200000 --json split.json

Each adversarial text repeats one pattern that a backtracking rule could rescan from every position (the
e-mail rule once did: "+." * 50,000 took 20 s); "prose" is CoNLL-like news text of the same length, and
"punctuation" a run of one mark. The ratio column is seconds / prose seconds, measured side by side in one
run (these machines are noisy; quote ratios). Results: docs/raw_text.md.
"""

from __future__ import annotations

import argparse
import json
import time

from ner.data.text import split_words

PROSE = ("Angela Merkel met Emmanuel Macron in Paris on Monday , the U.S. State Department said . Shares of "
         "Acme Corp. rose 3.5 % to $ 12,000 after O'Neill 's comments in St. Louis on 1996-12-06 . ")
PATTERNS = {
    "prose": PROSE,
    "punctuation": ".",
    "+.": "+.",
    "a@": "a@",
    "a.": "a.",
    "x.-@": "x.-@",
    "www.,": "www.,",
    "url": "http://example.com/a?b=c&",
    "1.": "1.",
    "a'": "a'",
    "combining marks": "a\u0301\u0308",
    "zero-width joiners": "a\u200d",
}


def text_of(pattern: str, chars: int) -> str:
    return (pattern * (chars // len(pattern) + 1))[:chars]


def best_seconds(text: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        split_words(text)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=100_000, help="length of each text (default: 100,000)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs (default: 3)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    rows = []
    for name, pattern in PATTERNS.items():
        rows.append({"pattern": name, "chars": args.chars, "seconds": best_seconds(text_of(pattern, args.chars),
                                                                                    args.repeats)})
    prose_s = rows[0]["seconds"]
    print(f"| pattern | seconds ({args.chars:,} chars) | x prose |\n|---|---:|---:|")
    for row in rows:
        row["ratio_to_prose"] = row["seconds"] / prose_s
        print(f"| `{row['pattern']}` | {row['seconds']:.3f} | {row['ratio_to_prose']:.2f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
