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
(paths, sizes, modification times, texts per file). The runtime is the one --runtime auto resolved to; a resume
with auto keeps it (or is refused where it cannot run any more): a further export could make auto pick another.
Rerunning the same command in the same environment skips finished parts and writes byte-identical output; anything
the manifest pins that differs is refused, naming each difference and its old value (--overwrite removes what
this tool wrote there and starts again); the number of processes is free. An error in any process reaches all of
them and is printed once, by rank 0. --merge: rank 0 concatenates the parts into OUT/predictions.jsonl once every
part exists. OUT must be a folder every process (and node) sees.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ner.backends import inference_backend
from ner.corpus.inputs import Source, Unit, expand_inputs, parse_unit
from ner.corpus.manifest import computation, pin, prepare, runtime_to_resume
from ner.corpus.plan import (
    CHUNK_TEXTS_RANGE,
    CHUNKS_AIMED_FOR,
    MERGED,
    Plan,
    finished_chunks,
    merge_parts,
    owned_chunks,
    part_name,
)
from ner.data.spans import entities_record
from ner.errors import UserError, report
from ner.files import atomic_write_text

log = logging.getLogger(__name__)


def output_line(record: dict, where: str, result: dict, spans: bool, raw_text: bool) -> str:
    """`result`: Tagger.predict's for the record's text ({"entities", "confidence"})."""
    if spans:
        out = entities_record(record, result)
    elif raw_text:
        out = result
    else:  # the record's other fields kept, its spans replaced by the predicted entities
        out = {**entities_record(record, result), "entities": result["entities"]}
    return json.dumps({"_source": where, **out}, ensure_ascii=False) + "\n"


def tag_chunk(tagger, args: argparse.Namespace, units: list[Unit]) -> str:
    """A chunk's output; every line is parsed before anything is tagged, so a bad one writes nothing."""
    records = [parse_unit(kind, where, payload) for kind, where, payload in units]
    results = tagger.predict([r["text"] for r in records], args.batch_size, args.max_tokens)
    return "".join(output_line(record, where, result, args.format == "spans", not args.jsonl)
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


def load_tagger(args: argparse.Namespace, backend):
    """This process's model copy on its device; --batch-size / --max-tokens resolved for what runs the passes
    (before the manifest is written, so a resume on another device type is refused, not mixed)."""
    from ner.inference.options import inference_budget
    from ner.inference.tagger import Tagger

    args.runtime = runtime_to_resume(args)
    tagger = Tagger.from_args(args, device=None if backend.device is None else str(backend.device))
    args.runtime = tagger.runtime_name  # what auto resolved to: the manifest pins it, and its files
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
    at the next collective for one that has already stopped. Any other exception is logged with its traceback
    first, by the process that met it: a bug or the machine (a KeyError, an out-of-memory), not the input."""
    error, cause = None, None
    try:
        yield
    except UserError as exc:
        error, cause = str(exc), exc
    except Exception as exc:  # not only ours: a FileNotFoundError or OOM would otherwise leave the others waiting
        error, cause = one_line(exc, backend), exc
        log.error("%s; its traceback:", error, exc_info=exc)  # the line alone hides where a bug is
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
    if args.chunk_texts < 0:
        raise UserError(f"--chunk-texts must be positive, or 0 for auto (got {args.chunk_texts})")
    if not args.inputs:
        raise UserError("--output-dir needs INPUT files, globs or folders (stdin cannot be resumed)")


def tag_corpus(args: argparse.Namespace) -> int:
    """The whole run in every process; an error is printed once, by rank 0, before any process leaves."""
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
        if backend.is_main_process:  # every process has written its parts: pinned, the merged file once written
            pin(args.output_dir, [part_name(k) for k in range(plan.chunks) if k not in plan.done])
        if args.merge and backend.is_main_process:
            merged = merge_parts(args.output_dir, plan)
            pin(args.output_dir, [MERGED])
            if not args.quiet:
                print(f"corpus: wrote {merged}", file=sys.stderr, flush=True)


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("corpus tagging (--output-dir; see ner/corpus/tagging.py)")
    group.add_argument("--output-dir", type=Path, default=None,
                       help="tag INPUT... into OUT/part-NNNNN.jsonl (resumable, any number of processes)")
    low, high = CHUNK_TEXTS_RANGE
    group.add_argument("--chunk-texts", type=int, default=0, metavar="N",
                       help=f"texts per part; 0: auto, about 1/{CHUNKS_AIMED_FOR} of the corpus, {low}-{high} "
                       "(default: 0)")
    group.add_argument("--merge", action="store_true", help="then concatenate the parts into OUT/" + MERGED)
    group.add_argument("--overwrite", action="store_true",
                       help="start again: remove the parts, manifest and merged file a previous run wrote in OUT")
    group.add_argument("--text-column", default="text", help="parquet / datasets input: the column of texts")
    group.add_argument("--dist-timeout", type=float, default=7200.0,
                       help="seconds a process waits for the others at the start and the end (default: 7200)")
