"""Run every shell block of README.md, in order, in a fresh clone: what a newcomer would type.

    git clone -q . ../readme-check && cd ../readme-check && python -m venv .venv && . .venv/bin/activate
    python scripts/run_readme.py --log readme_run.log

Each ```bash block runs as one `bash -e` script in the clone's root (so `&` and `kill %1` pair up), with the
block's lines echoed; the log gets each block's exit code and seconds. Blocks whose first command is `pip` run only
with --install (a fresh environment needs them; an existing one may not). It stops at the first block that fails.
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


def shell_blocks(readme: Path) -> list[tuple[int, str]]:
    """(first line number, text) of every ```bash block."""
    text = readme.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def installs(block: str) -> bool:
    first = next((line for line in block.splitlines() if line.strip() and not line.startswith("#")), "")
    return first.startswith(("pip ", "python -m venv"))


def run_block(line: int, block: str, log) -> int:
    print(f"--- README.md:{line}\n{block}", file=log, flush=True)
    started = time.perf_counter()
    done = subprocess.run(["bash", "-e", "-c", block], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    print(f"--- README.md:{line}: exit {done.returncode} in {time.perf_counter() - started:.0f} s", file=log,
          flush=True)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, default=Path("readme_run.log"), help="where the output goes")
    parser.add_argument("--install", action="store_true", help="also run the blocks that install (pip, venv)")
    parser.add_argument("--from-line", type=int, default=0, metavar="N", help="start at the block on line N or after")
    args = parser.parse_args(argv)
    with args.log.open("w", encoding="utf-8") as log:
        for line, block in shell_blocks(ROOT / "README.md"):
            if line < args.from_line:
                continue
            if installs(block) and not args.install:
                print(f"--- README.md:{line}: an install block, skipped (--install runs it)", file=log)
                continue
            code = run_block(line, block, log)
            print(f"README.md:{line}: exit {code}")
            if code != 0:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
