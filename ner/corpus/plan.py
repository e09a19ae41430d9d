"""How a corpus is cut and where the pieces go: chunks of --chunk-texts texts, a size that depends on the corpus
alone (never on the number of processes); the chunks not done dealt round-robin; chunk k written whole as
OUT/part-<k>.jsonl; --merge streams the parts, in order, into OUT/predictions.jsonl.
"""

from __future__ import annotations

import itertools
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ner.corpus.inputs import READ_BLOCK_BYTES, Source, Unit, iter_units
from ner.errors import UserError
from ner.files import staged_file

MERGED = "predictions.jsonl"
PART = re.compile(r"part-(\d{5,})\.jsonl")
# --chunk-texts 0 (auto): about CHUNKS_AIMED_FOR chunks of the corpus, within CHUNK_TEXTS_RANGE (docs/corpus.md:
# chunks dealt round-robin balance processes only when each gets several, and every chunk costs a part-filled
# forward per batch width, so small chunks are slow; figures in "The default chunk size")
CHUNKS_AIMED_FOR, CHUNK_TEXTS_RANGE = 16, (2048, 4096)
DEFAULT_CHUNK_TEXTS = CHUNK_TEXTS_RANGE[1]  # Ray Data's batch size (RayTagger)


def part_name(chunk: int) -> str:
    return f"part-{chunk:05d}.jsonl"


def chunk_texts_for(requested: int, texts: int) -> int:
    """The chunk size: as given, or for auto (0) one from the corpus size alone (never from the number of processes,
    so every run over the same input cuts the same chunks): about CHUNKS_AIMED_FOR, within CHUNK_TEXTS_RANGE."""
    if requested:
        return requested
    low, high = CHUNK_TEXTS_RANGE
    return max(low, min(high, -(-texts // CHUNKS_AIMED_FOR)))


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


def finished_chunks(out_dir: Path) -> set[int]:
    """Parts on disk: each exists only whole (renamed into place after it was written)."""
    return {int(m.group(1)) for p in out_dir.iterdir() if (m := PART.fullmatch(p.name))}


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
