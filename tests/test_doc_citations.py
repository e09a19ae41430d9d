"""Code and docs cite a section as `docs/FILE.md, "Heading"` (or `README, "Heading"`): the cited file must have a
heading, or a paragraph's bold lead-in (`**Long texts.**`), that says it, so a renamed or removed section cannot
leave a pointer to nothing behind."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"\b(README(?:\.md)?|docs/[a-z_]+\.md),\s+\"([^\"\n]+)\"")


def headings(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return ([line.lstrip("#").strip() for line in lines if line.startswith("#")]
            + [line.split("**")[1] for line in lines if line.startswith("**") and line.count("**") >= 2])


def citations() -> list[tuple[str, str, str]]:
    """(where, cited file, heading) for every citation in ner/, benchmarks/, scripts/, docs/ and the README."""
    files = [*ROOT.glob("ner/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py"),
             *ROOT.glob("docs/*.md"), ROOT / "README.md"]
    found = []
    for path in sorted(files):
        for match in CITATION.finditer(path.read_text(encoding="utf-8")):
            cited = "README.md" if match[1].startswith("README") else match[1]
            found.append((path.relative_to(ROOT).as_posix(), cited, match[2]))
    return found


def test_every_cited_section_exists():
    found = citations()
    assert len(found) >= 10  # the pattern still finds what the code writes
    stale = [f"{where}: {cited}, \"{heading}\"" for where, cited, heading in found
             if not (ROOT / cited).is_file() or not any(heading in h for h in headings(ROOT / cited))]
    assert not stale, "citations of sections that do not exist:\n" + "\n".join(stale)
