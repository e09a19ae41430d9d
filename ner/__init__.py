"""ner: fine-tune BERT-style encoders for named-entity recognition, through Accelerate or plain torch.

The package is grouped by job (docs/layout.md, "Every module"); imports run one way between the groups
(tests/test_layout.py). Commands are the modules at the top:
`python -m ner.train|predict|select|evaluate|export|serve|plot`.
"""

__version__ = "0.1.0"

__all__ = ["Tagger"]  # noqa: F822 (module __getattr__ below: the import waits for first use)


def __getattr__(name: str):
    # `from ner import Tagger` without making `import ner` (and every entry point) import torch first.
    if name == "Tagger":
        from ner.inference.tagger import Tagger

        return Tagger
    raise AttributeError(f"module 'ner' has no attribute {name!r}")
