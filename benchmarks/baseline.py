"""The benchmark's baseline: one epoch the way transformers' run_ner_no_trainer.py trains, in its own process.

    python -m benchmarks.baseline --train-file train.conll --validation-file valid.conll --result out/result.json

benchmarks.training_speed runs this as a subprocess (so its wall time, CPU time and peak RSS are the
baseline's alone). Random shuffle, DataCollatorForTokenClassification padding per batch of 32
sentences, fp32, torch.optim.AdamW lr 5e-5 (no-decay groups, weight decay 0.0), linear schedule
without warmup, first subword labelled, truncation at 128 subwords; seqeval on the validation
file, with words lost to truncation counted as O. Writes RESULT (JSON): each update's end time and
micro-batch shape `[rows, padded width, real tokens]`, F1 and settings; the model beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.measure import synchronize
from ner.data.conll import read_conll
from ner.data.encode import IGNORE_INDEX
from ner.data.examples import Example

MAX_LENGTH = 128  # run_ner_no_trainer's --max_length default


def baseline_features(tokenizer, examples: list[Example], label2id: dict[str, int], max_length: int) -> list[dict]:
    """run_ner_no_trainer's tokenize_and_align_labels: first subword labelled, -100 elsewhere."""
    encoded = tokenizer([e.words for e in examples], is_split_into_words=True, truncation=True, max_length=max_length)
    features = []
    for i, example in enumerate(examples):
        labels, previous = [], None
        for word_id in encoded.word_ids(i):
            labels.append(IGNORE_INDEX if word_id is None or word_id == previous else label2id[example.tags[word_id]])
            previous = word_id
        features.append({**{k: encoded[k][i] for k in encoded.keys()}, "labels": labels})
    return features


def baseline_train(model, loader, optimizer, scheduler, device) -> tuple[list[float], list[list[list[int]]]]:
    """The canonical loop; returns each update's end time and its micro-batch shapes (one per update)."""
    model.train()
    step_times, steps = [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        synchronize(device)
        step_times.append(time.time())
        rows, width = batch["attention_mask"].shape
        steps.append([[int(rows), int(width), int(batch["attention_mask"].sum())]])
    return step_times, steps


def baseline_evaluate(model, tokenizer, examples: list[Example], label2id: dict[str, int], device,
                      batch_size: int = 8) -> dict:
    """run_ner_no_trainer's evaluation (batches of 8, collator); words lost to truncation count as O."""
    import torch
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForTokenClassification

    from ner.metrics import entity_scores

    id2label = {i: label for label, i in label2id.items()}
    features = baseline_features(tokenizer, examples, label2id, MAX_LENGTH)
    loader = DataLoader(features, batch_size=batch_size, collate_fn=DataCollatorForTokenClassification(tokenizer))
    model.eval()
    predicted = []
    start = time.perf_counter()
    with torch.no_grad():
        for batch in loader:
            logits = model(**{k: v.to(device) for k, v in batch.items() if k != "labels"}).logits
            for row_pred, row_gold in zip(logits.argmax(-1).tolist(), batch["labels"].tolist(), strict=True):
                predicted.append([id2label[p] for p, g in zip(row_pred, row_gold, strict=True) if g != IGNORE_INDEX])
    seconds = time.perf_counter() - start
    gold = [e.tags for e in examples]
    padded = [p + ["O"] * (len(g) - len(p)) for p, g in zip(predicted, gold, strict=True)]
    truncated = sum(len(p) < len(g) for p, g in zip(predicted, gold, strict=True))
    return {"scores": entity_scores(gold, padded), "eval_s": seconds, "truncated_sentences": truncated}


def build_optimizer(model, learning_rate: float, weight_decay: float):
    """torch.optim.AdamW with run_ner_no_trainer's two groups: no decay for biases and LayerNorm weights."""
    import torch

    no_decay = ["bias", "LayerNorm.weight"]
    groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": weight_decay},
              {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate)


def build_model(model_path: str, label_list: list[str], device):
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(model_path, num_labels=len(label_list), id2label=dict(enumerate(label_list)),
                                        label2id={label: i for i, label in enumerate(label_list)})
    return AutoModelForTokenClassification.from_pretrained(model_path, config=config).to(device)


def run(args: argparse.Namespace) -> dict:
    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer, DataCollatorForTokenClassification, get_scheduler, set_seed

    from ner.backends import default_device
    from ner.training.model import resolve_model_path

    set_seed(args.seed)
    device, path = default_device(), resolve_model_path(args.model)
    start = time.perf_counter()
    train, valid = read_conll(args.train_file), read_conll(args.validation_file)
    label_list = sorted({t for e in train for t in e.tags})
    label2id = {label: i for i, label in enumerate(label_list)}
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = build_model(path, label_list, device)
    loader = DataLoader(baseline_features(tokenizer, train, label2id, MAX_LENGTH), shuffle=True,
                        collate_fn=DataCollatorForTokenClassification(tokenizer), batch_size=args.batch_size)
    optimizer = build_optimizer(model, args.learning_rate, args.weight_decay)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=len(loader))
    prep_s = time.perf_counter() - start
    step_times, steps = baseline_train(model, loader, optimizer, scheduler, device)
    evaluation = baseline_evaluate(model, tokenizer, valid, label2id, device)
    model.save_pretrained(args.result.parent / "baseline_model")
    tokenizer.save_pretrained(args.result.parent / "baseline_model")
    return {"step_times": step_times, "steps": steps, "prep_s": prep_s, "f1": evaluation["scores"]["f1"],
            "scores": evaluation["scores"], "eval_s": evaluation["eval_s"], "threads": torch.get_num_threads(),
            "truncated_valid_sentences": evaluation["truncated_sentences"], "label_list": label_list,
            "attn_implementation": model.config._attn_implementation, "device": str(device),
            "optimizer_foreach": optimizer.defaults.get("foreach"), "optimizer_fused": optimizer.defaults.get("fused")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-file", type=Path, required=True, help="CoNLL file to train one epoch on")
    parser.add_argument("--validation-file", type=Path, required=True, help="CoNLL file to score")
    parser.add_argument("--result", type=Path, required=True, help="JSON file to write; the model goes beside it")
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="encoder (packaged MiniLM)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
