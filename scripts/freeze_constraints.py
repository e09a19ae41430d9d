"""Write constraints.txt: the versions of an environment where the test suite last passed.

    python -m venv /tmp/fresh && . /tmp/fresh/bin/activate
    pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q
    python scripts/freeze_constraints.py              # once the suite passed in that environment
    python scripts/freeze_constraints.py --out FILE   # somewhere else

Run it with the Python of a fresh environment made as above (not a long-lived one, whose leftovers are what
CI must not see; `.ci/run` deletes the one it makes). Users install from it for a reproducible environment:

    pip install torch==2.13.0 && pip install -e ".[test]" -c constraints.txt

CI itself installs without it, as a new user does, so the next incompatible release shows at a landing.
Local version labels are dropped (`torch==2.13.0+cpu` -> `torch==2.13.0`), so the file also admits the CUDA
build of the same release; this project (an editable install) is left out.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = "# Versions with which the test suite passed (scripts/freeze_constraints.py"  # how a file of ours begins


def written_here(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as handle:
            return handle.readline().startswith(HEADER)
    except (OSError, UnicodeDecodeError):
        return False


def frozen_requirements(python: str) -> list[str]:
    """`name==version` of every installed distribution but editable ones, sorted, without local labels."""
    listed = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"], check=True, capture_output=True,
                            text=True).stdout.splitlines()
    pinned = [line.split("+")[0] for line in listed if "==" in line and not line.startswith("-e ")]
    return sorted(pinned, key=str.lower)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "constraints.txt",
                        help="file to write (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out even where this script did not write it")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite and not written_here(args.out):
        print(f"error: {args.out}: exists and was not written by this script; nothing was changed: pass --overwrite "
              "to replace it, or choose another --out", file=sys.stderr)
        return 2
    pins = frozen_requirements(sys.executable)
    if not any(pin.lower().startswith("pytest==") for pin in pins):
        print(f"error: {sys.executable} has no pytest: run this with the Python of the environment the tests "
              "passed in (.ci/run prints it)", file=sys.stderr)
        return 2
    header = (f"{HEADER}, "
              f"{datetime.now(timezone.utc):%Y-%m-%d}, Python {platform.python_version()}, {platform.machine()}).\n"
              '# pip install torch==2.13.0 && pip install -e ".[test]" -c constraints.txt\n')
    args.out.write_text(header + "".join(pin + "\n" for pin in pins))
    print(f"wrote {args.out} ({len(pins)} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
