"""What corpus tagging reads: INPUT files, globs and folders as Sources (raw text a text a line, span JSONL,
parquet, datasets folders), counted, then each text read lazily as a Unit and parsed only where its chunk is tagged.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ner.data.span_files import text_of
from ner.errors import UserError
from ner.files import tree_paths

READ_BLOCK_BYTES = 1 << 20
Unit = tuple[str, str, object]  # (kind, where, payload): a text as read, parsed only where it is tagged


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
    def hidden(relative: str) -> bool:
        return PurePosixPath(relative).name.startswith(".")

    paths = (folder / relative for relative in tree_paths(folder, into=lambda relative: not hidden(relative))
             if not hidden(relative))
    return sorted(path for path in paths if path.is_file() and not _inside(path, out_dir))


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
