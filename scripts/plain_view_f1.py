"""Test F1 of an export as a plain transformers user reads it: AutoModelForTokenClassification, each sentence
alone, no token_type_ids (so casing type 0 everywhere), each word's first subword, argmax; seqeval scores.

    python scripts/plain_view_f1.py runs/conll2003-minilm/final ../shared/data/conll2003/test.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from seqeval.metrics import f1_score
from transformers import AutoModelForTokenClassification, AutoTokenizer

from ner.data.conll import read_conll


def plain_tags(model, tokenizer, words: list[str]) -> list[str]:
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, return_tensors="pt",
                        return_token_type_ids=False)
    with torch.no_grad():
        predicted = model(**encoded).logits[0].argmax(-1).tolist()
    tags = ["O"] * len(words)
    seen = set()
    for position, word in enumerate(encoded.word_ids(0)):
        if word is not None and word not in seen:
            seen.add(word)
            tags[word] = model.config.id2label[predicted[position]]
    return tags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="an exported model folder")
    parser.add_argument("conll_file", help="a CoNLL file with gold tags")
    args = parser.parse_args(argv)
    model_dir, conll_file = args.model_dir, args.conll_file
    model = AutoModelForTokenClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    examples = [e for e in read_conll(Path(conll_file)) if e.words]
    predicted = [plain_tags(model, tokenizer, e.words) for e in examples]
    print(f"plain view test F1 {100 * f1_score([e.tags for e in examples], predicted):.2f} "
          f"({len(examples)} sentences, {model_dir})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
