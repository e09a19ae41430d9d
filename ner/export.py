"""Export a checkpoint as a standard Hugging Face model folder.

    python -m ner.export runs/ner/checkpoints/step_120 exported/
    python -c "from transformers import pipeline; print(pipeline('token-classification', \
        model='exported', aggregation_strategy='simple')('Ada Lovelace visited London'))"

The folder holds model.safetensors, config.json (with id2label / label2id), the tokenizer,
training_args.json, metrics.json and a README.md model card. It is written beside its final
name and renamed into place, so a crash never leaves half an export.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ner.checkpoint import read_state, verify
from ner.errors import USAGE_EXIT_CODE, UserError
from ner.metrics import format_table


def export_checkpoint(checkpoint: Path, out_dir: Path, metrics: dict | None = None) -> Path:
    """Copy the checkpoint's model folder and describe it; `metrics` defaults to its evals."""
    problem = verify(checkpoint)
    if problem is not None:
        raise UserError(f"{checkpoint}: not a complete checkpoint: {problem}")
    state = read_state(checkpoint)
    if metrics is None:
        metrics = {"validation": best_eval(state)}
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint / "model", tmp)
    training_args = {**state["config"], "label_list": state["label_list"], "tag_scheme": state["tag_scheme"],
                     "global_step": state["global_step"], "versions": state["versions"],
                     "source_checkpoint": str(checkpoint)}
    (tmp / "training_args.json").write_text(json.dumps(training_args, indent=2, sort_keys=True) + "\n")
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    (tmp / "README.md").write_text(model_card(training_args, metrics), encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def best_eval(state: dict) -> dict | None:
    evals = [e for e in state.get("eval_history", []) if e.get("step") == state.get("best_step")]
    return evals[-1]["scores"] if evals else None


def model_card(args: dict, metrics: dict) -> str:
    labels = ", ".join(f"`{label}`" for label in args["label_list"])
    sections = [
        "---\nlibrary_name: transformers\npipeline_tag: token-classification\ntags: [ner, token-classification]\n---",
        f"# NER model fine-tuned from `{args['model']}`",
        "Fine-tuned for named-entity recognition with [ner](https://example.invalid/ner) "
        "(Accelerate / DDP BERT-NER trainer).",
        "## Data\n" + "\n".join(f"- {name}: `{args.get(key) or '-'}`" for name, key in
                                 (("train", "train_file"), ("validation", "validation_file"),
                                  ("test", "test_file"), ("dataset", "dataset"))),
        f"## Labels\nTag scheme `{args['tag_scheme']}`; {len(args['label_list'])} labels: {labels}",
        "## Hyperparameters\n" + "\n".join(f"- {key}: `{args[key]}`" for key in (
            "num_epochs", "max_steps", "batch_size", "max_tokens", "gradient_accumulation_steps",
            "learning_rate", "lr_scheduler", "warmup_ratio", "weight_decay", "max_seq_length",
            "mixed_precision", "seed") if key in args) + f"\n- optimizer updates: `{args['global_step']}`",
    ]
    for split in ("validation", "test"):
        if metrics.get(split):
            sections.append(f"## Metrics ({split}, entity-level, seqeval)\n{format_table(metrics[split])}")
    sections.append(
        "## Use\n```python\nfrom transformers import pipeline\n"
        "tagger = pipeline(\"token-classification\", model=\"PATH/TO/THIS/FOLDER\", "
        "aggregation_strategy=\"simple\")\nprint(tagger(\"Angela Merkel visited Paris with Siemens.\"))\n```\n"
        "```bash\necho \"Angela Merkel visited Paris\" | python -m ner.predict PATH/TO/THIS/FOLDER\n```")
    return "\n\n".join(sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ner.export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint folder (OUTPUT_DIR/checkpoints/step_N)")
    parser.add_argument("out_dir", type=Path, help="folder to write the Hugging Face model into")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_EXIT_CODE
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
