"""ner: fine-tune BERT-style encoders for named-entity recognition, through Accelerate or plain torch."""

__version__ = "0.1.0"

__all__ = ["Tagger"]


def __getattr__(name: str):
    # `from ner import Tagger` without making `import ner` (and every entry point) import torch first.
    if name == "Tagger":
        from ner.infer import Tagger

        return Tagger
    raise AttributeError(f"module 'ner' has no attribute {name!r}")
