"""Run every shell block of README.md, in order, in a fresh clone: what a newcomer would type.

    git clone -q . ../readme-check && cd ../readme-check && python -m venv .venv && . .venv/bin/activate
    python scripts/run_readme.py --log readme_run.log

Each ```bash block runs as one `bash -e` script in the clone's root (so `&` and `kill %1` pair up), its lines echoed
into the log with its exit code and seconds; it stops at the first block that fails. Left out: lines that run the
test suite (`python -m pytest`; `--tests` keeps them: CI runs the suite anyway) and the block that runs this script.
tests/test_docs_commands.py checks that every documented command parses; this runs them.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
THIS = "scripts/run_readme.py"


def shell_blocks(readme: Path) -> list[tuple[int, str]]:
    """(first line number, text) of every ```bash block."""
    text = readme.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def runnable(block: str, tests: bool) -> str:
    """The block less the lines left out (see the module's docstring); empty where the whole block is."""
    if THIS in block:
        return ""
    return "".join(line for line in block.splitlines(keepends=True) if tests or "python -m pytest" not in line)


def run_block(line: int, block: str, log) -> int:
    print(f"--- README.md:{line}\n{block}", file=log, flush=True)
    started = time.perf_counter()
    done = subprocess.run(["bash", "-e", "-c", block], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    print(f"--- README.md:{line}: exit {done.returncode} in {time.perf_counter() - started:.0f} s", file=log,
          flush=True)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, default=Path("readme_run.log"), help="where the output goes (new)")
    parser.add_argument("--overwrite-log", action="store_true", help="replace --log if it exists")
    parser.add_argument("--tests", action="store_true", help="also run the lines that run the test suite")
    parser.add_argument("--from-line", type=int, default=0, metavar="N", help="start at the block on line N or after")
    args = parser.parse_args(argv)
    if args.log.exists() and not args.overwrite_log:
        print(f"error: {args.log} exists; pass --overwrite-log to replace it, or another --log", file=sys.stderr)
        return 2
    with args.log.open("w", encoding="utf-8") as log:
        for line, block in shell_blocks(ROOT / "README.md"):
            if line < args.from_line or not (commands := runnable(block, args.tests)).strip():
                continue
            code = run_block(line, commands, log)
            print(f"README.md:{line}: exit {code}")
            if code != 0:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
