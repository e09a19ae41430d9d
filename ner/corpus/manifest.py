"""OUT/manifest.json and who owns OUT: what a run pins (the model's files, the settings, how the numbers are
computed, the input), the refusal of a resume that could differ (each difference named, with how to get the old
value back), and which files in OUT are this tool's, the only ones it ever removes. prepare() is rank 0's step
before anyone writes.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ner.corpus.inputs import Source, count_texts
from ner.corpus.plan import MERGED, Plan, chunk_texts_for, finished_chunks, part_name
from ner.data.examples import Example
from ner.errors import UserError
from ner.files import (
    file_entry,
    read_whole_record,
    remove_recorded,
    same_bytes,
    sha256_file,
    temporary_of,
    write_record,
)
from ner.inference.runtimes import RUNTIME_FILES

log = logging.getLogger("ner")

MANIFEST = "manifest.json"
CORPUS_TOOL = "ner.predict"
# 2: the computation (precision, device, threads, ...) is pinned; 3: --chunk-texts and --max-tokens spell auto as 0
MANIFEST_VERSION = 3


def file_identity(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def model_identity(model_dir: Path, runtime: str) -> dict:
    """The files that decide the model's answers: weights, config, tokenizer, training_args.json. The model
    card (README.md) and the files only other runtimes read are left out."""
    if not (model_dir / "config.json").is_file():
        raise UserError(f"{model_dir}: not a model folder (no config.json); pass OUTPUT_DIR/final")
    unused = {name for names in RUNTIME_FILES.values() for name in names} - set(RUNTIME_FILES[runtime])
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".")
                   and p.name != "README.md" and p.name not in unused)
    return {"path": str(model_dir.resolve()), "sha256": {p.name: sha256_file(p) for p in files}}


def corpus_settings(args: argparse.Namespace) -> dict:
    """The options that decide what a part holds and how its lines are written (--chunk-texts: which texts)."""
    return {"format": args.format, "jsonl": args.jsonl, "text_column": args.text_column,
            "chunk_texts": args.chunk_texts}


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
    """The threads one CPU operator uses: the ONNX session's own setting; torch's passes run on one thread
    each, however many run at once (inference/torch_runtime.py), so the process's thread count is free."""
    if hasattr(runtime, "session"):
        return runtime.session.get_session_options().intra_op_num_threads
    return runtime.threads_per_forward


def runtime_to_resume(args: argparse.Namespace) -> str:
    """--runtime auto resuming a run: the runtime its finished parts were tagged with, so that a resume never mixes
    runtimes (a further export since would make auto choose another); refused where that runtime cannot run here
    now. An explicit --runtime is the user's: a different one is refused as any changed setting is (prepare)."""
    from ner.inference.runtimes import AUTO_RUNTIME, missing

    saved = None if args.runtime != AUTO_RUNTIME or args.overwrite else read_whole_record(
        args.output_dir, CORPUS_TOOL, MANIFEST)
    old = ((saved or {}).get("computation") or {}).get("runtime")
    if old is None:
        return args.runtime
    fix = missing(old, args.model_dir) if old in RUNTIME_FILES else "not a runtime this version knows"
    if fix is not None:
        raise UserError(f"{args.output_dir}: its parts were tagged with --runtime {old} (what auto chose then), "
                        f"which cannot run here now ({fix}); make it runnable to resume, or pass --overwrite to "
                        "start again")
    log.info("--runtime auto: %s, the runtime the finished parts in %s were tagged with", old, args.output_dir)
    return old


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
                        f"writes version {MANIFEST_VERSION}; finish that run with the ner.predict that started "
                        "it, or pass --overwrite to start again")
    settings, fixes = setting_differences(saved, current)
    changed = model_differences(saved, current) + settings + input_differences(saved, current)
    if changed:
        how = f" ({', '.join(fixes)})" if fixes else ""
        raise UserError(f"{out_dir}: written by another run ({'; '.join(changed)}); run with that run's model, "
                        f"settings and input{how} to resume, or pass --overwrite to start again (it removes only "
                        f"parts, manifest and {MERGED})")


# ----------------------------------------------------------------------------- the output folder


def written_names(plan: Plan) -> dict[str, dict]:
    """The manifest's record entries: every part of the plan and the merged file, not pinned until written (pin)."""
    return {name: {} for name in [*map(part_name, range(plan.chunks)), MERGED]}


def pin(out_dir: Path, names: list[str], unpinned_only: bool = False) -> None:
    """Rank 0: pin (size, sha256) the files `names` of OUT that exist, in its manifest: each part once every process
    has written its parts, the merged file once written, so that one edited since is the user's (it is then never
    removed, and refused: refuse_edited). `unpinned_only`: only those still recorded as {}: a part a killed run
    renamed into place whole before it could pin it, pinned by the rerun as it finds it."""
    record = read_whole_record(out_dir, CORPUS_TOOL, MANIFEST)
    entries = record["files"]
    found = [name for name in names if (out_dir / name).is_file() and not (unpinned_only and entries.get(name))]
    if found:
        entries |= {name: file_entry(out_dir / name) for name in found}
        more = {key: value for key, value in record.items() if key not in ("tool", "files")}
        write_record(out_dir, CORPUS_TOOL, entries, MANIFEST, fsync=True, **more)


def refuse_edited(out_dir: Path, saved: dict, overwrite: bool) -> None:
    """A part or merged file whose bytes are not those pinned is the user's: the rerun would take it for its own
    (or replace it), --overwrite would remove it. Refused before anything is written."""
    for name, entry in sorted(saved["files"].items()):
        path = out_dir / name
        if "sha256" in entry and (path.exists() or path.is_symlink()) and not same_bytes(path, entry):
            does = "--overwrite would remove it" if overwrite else "this run would take it for its own or replace it"
            raise UserError(f"{path}: changed since ner.predict wrote it, so it is yours now, and {does}: move it "
                            "away and run again (nothing was changed)")


def remove_ours(out_dir: Path, saved: dict, temporaries_only: bool = False) -> None:
    """Delete what the run of manifest `saved` wrote in OUT (the files it records, as pinned, the manifest, and
    temporary files ner/files.py made for them: a killed writer's leftovers, ours beyond doubt); nothing else."""
    written = {*saved["files"], MANIFEST}
    ours = [path.name for path in out_dir.iterdir() if path.is_file() and (
        temporary_of(path.name, roles=("tmp",)) in written or path.name in written and not temporaries_only)]
    remove_recorded(out_dir, {name: saved["files"].get(name, {}) for name in ours})  # the rest of OUT stays


def check_folder_is_ours(out_dir: Path) -> dict | None:
    """The manifest of a folder this tool wrote, None for a new or empty folder; another folder is refused."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise UserError(f"{out_dir}: not a folder; --output-dir needs a new or empty folder, or one it wrote")
    manifest = read_whole_record(out_dir, CORPUS_TOOL, MANIFEST)
    if manifest is not None:
        return manifest
    other = next(iter(sorted(out_dir.iterdir())), None)
    if other is not None:
        raise UserError(f"{other}: --output-dir {out_dir} is not empty and holds no ner.predict manifest; "
                        "pick a new or empty folder (nothing was changed there)")
    return None


def prepare(args: argparse.Namespace, sources: list[Source], computed: dict) -> Plan:
    """Rank 0, before anyone writes: check OUT, refuse a changed run (or start again), count, write the manifest."""
    out_dir: Path = args.output_dir
    saved = check_folder_is_ours(out_dir)
    current = {"version": MANIFEST_VERSION,
               "model": model_identity(args.model_dir, args.runtime), "settings": corpus_settings(args),
               "computation": computed, "inputs": input_identity(sources)}
    if saved is not None:
        refuse_edited(out_dir, saved, args.overwrite)
    if saved is not None and args.overwrite:
        remove_ours(out_dir, saved)
        saved = None
    if saved is not None:
        check_resumable(out_dir, saved, current)
        pin(out_dir, list(saved["files"]), unpinned_only=True)
        remove_ours(out_dir, saved, temporaries_only=True)  # a killed writer's leftovers; the parts are whole
        chunk_texts = saved.get("chunk_texts") or chunk_texts_for(args.chunk_texts, saved["texts"])
        return Plan(saved["texts"], chunk_texts, frozenset(finished_chunks(out_dir)))
    counts = [count_texts(source, args.text_column) for source in sources]
    for source, count in zip(current["inputs"], counts):
        source["texts"] = count
    current["texts"] = sum(counts)
    current["chunk_texts"] = chunk_texts_for(args.chunk_texts, current["texts"])
    plan = Plan(current["texts"], current["chunk_texts"], frozenset())
    out_dir.mkdir(parents=True, exist_ok=True)
    write_record(out_dir, CORPUS_TOOL, written_names(plan), MANIFEST, fsync=True, **current)
    return plan
