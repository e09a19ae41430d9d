"""Inference timing for the benchmark: sentences/s and F1 of the project's inference path on a trained run.

    python -m benchmarks.eval_speed bench_out/runs/ours/final ../shared/data/conll2003/valid.txt --sentences 1000
    python -m benchmarks.training_speed --out bench_out/ --no-main --inference   # the same rows, into bench.md

    from benchmarks.eval_speed import measure_inference
    results = measure_inference(Path("bench_out/runs/ours/final"), read_conll(Path("valid.conll")))

Rows: a hand loop of one sentence at a time through the Hugging Face model in fp32 (the reference);
ner.inference.tagger's Tagger.tag length-batched with ner.predict's defaults, with `auto` autocast (bf16 where
supported) and in fp32; Tagger.tag one sentence per call; and the evaluation a training run does
(Tagger.tag set up as the run was, under its evaluation batch limits, scored in its tag scheme).
Each times the whole call: tokenisation, forward passes, merging windows back to words; F1 is
seqeval's, outside the timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.report import REFERENCE_INFERENCE, inference_table
from ner.data.conll import read_conll
from ner.data.examples import Example


def timed_tags(tag_all, examples: list[Example], scheme: str = "iob2") -> dict:
    """Seconds and sentences/s of `tag_all()` (returns one tag list per example), and the F1 of its tags."""
    from ner.metrics import entity_scores

    start = time.perf_counter()
    tags = tag_all()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences_per_s": len(examples) / seconds,
            "f1": entity_scores([e.tags for e in examples], tags, scheme)["f1"]}


def one_at_a_time_hf(model_dir: Path, examples: list[Example]) -> dict:
    """The usual hand loop: tokenise one sentence, forward in fp32, first subword's argmax."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from ner.backends import default_device

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir).eval().to(default_device())
    id2label = {int(k): v for k, v in model.config.id2label.items()}

    @torch.no_grad()
    def tag_all() -> list[list[str]]:
        out = []
        for example in examples:
            encoded = tokenizer(example.words, is_split_into_words=True, truncation=True, max_length=128,
                                return_tensors="pt")
            predicted = model(**encoded.to(model.device)).logits.argmax(-1)[0].tolist()
            tags, previous = ["O"] * len(example.words), None
            for position, word_id in enumerate(encoded.word_ids(0)):
                if word_id is not None and word_id != previous:
                    tags[word_id] = id2label[predicted[position]]
                previous = word_id
            out.append(tags)
        return out

    return timed_tags(tag_all, examples)


def evaluation_tagger(model_dir: Path):
    """A Tagger set up as the run that exported `model_dir` evaluated: its window length, width rounding, dtype (and
    torch, the runtime training evaluates with)."""
    from ner.inference.runtimes import TORCH
    from ner.inference.tagger import Tagger

    training_args = json.loads((model_dir / "training_args.json").read_text())
    tagger = Tagger(model_dir, precision=training_args["mixed_precision"], runtime=TORCH,
                    max_seq_length=training_args["max_seq_length"],
                    pad_to_multiple_of=training_args.get("pad_to_multiple_of", 1))
    return tagger, training_args


def timed_evaluate(tagger, training_args: dict, examples: list[Example]) -> dict:
    """The validation pass of the run whose export `tagger` holds (see evaluation_tagger), in one process.

    Times Tagger.tag (ner.inference.tagger's batched forward and window merging, which training's evaluation also
    runs) under the evaluation batch rule training uses: inference_batch_limits of the run's own
    batch_size and max_tokens. Then scores with entity_scores in the run's tag scheme (not timed).
    """
    from ner.inference.options import inference_batch_limits

    limits = inference_batch_limits(training_args["batch_size"], training_args["max_tokens"])
    return timed_tags(lambda: tagger.tag(examples, *limits)[0], examples, training_args.get("tag_scheme", "iob2"))


def measure_inference(model_dir: Path, examples: list[Example]) -> dict:
    """Every row of the inference table (see the module docstring), keyed by a label naming path and dtype."""
    from ner.inference.runtimes import TORCH
    from ner.inference.tagger import Tagger

    # torch, as the reference is: the rows measure batching and dtype, not the runtime (benchmarks/inference.py does)
    results = {REFERENCE_INFERENCE: one_at_a_time_hf(model_dir, examples)}
    for precision in ("auto", "no"):
        tagger = Tagger(model_dir, precision=precision, runtime=TORCH)
        tagger.tag(examples[:64])  # kernels and thread pools warm before the timing
        results[f"ner.inference.tagger Tagger.tag, length-batched ({tagger.precision})"] = timed_tags(
            lambda t=tagger: t.tag(examples)[0], examples)
    tagger = Tagger(model_dir, runtime=TORCH)
    results[f"ner.inference.tagger Tagger.tag, one sentence per call ({tagger.precision})"] = timed_tags(
        lambda: [tagger.tag([e])[0][0] for e in examples], examples)
    tagger, training_args = evaluation_tagger(model_dir)
    tagger.tag(examples[:64])
    results[f"evaluation (Tagger.tag, training's batch limits, {tagger.precision})"] = timed_evaluate(
        tagger, training_args, examples)
    return results


def score_export(model_dir: Path, examples: list[Example]) -> dict:
    """F1 of a run that wrote no validation score, and the seconds its evaluation would have cost (model
    loading included: the bench adds them to the run's process time)."""
    start = time.perf_counter()
    result = timed_evaluate(*evaluation_tagger(model_dir), examples)
    return {"f1": result["f1"], "eval_added_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="an exported model folder with its training_args.json")
    parser.add_argument("conll", type=Path, help="CoNLL file with gold tags (validation)")
    parser.add_argument("--sentences", type=int, default=None, help="the first N sentences only (default: all)")
    args = parser.parse_args(argv)
    print(inference_table(measure_inference(args.model_dir, read_conll(args.conll)[:args.sentences])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
