"""ner: fine-tune BERT-style encoders for named-entity recognition, through Accelerate or plain torch.

The package is grouped by job (README, "Where things are"); imports run one way between the groups
(tests/test_layout.py). Commands are the modules at the top: `python -m ner.train|predict|evaluate|export|serve|plot`.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

__all__ = ["Tagger"]

# Module paths from before the grouping, kept so code that imports them goes on working: importing one gives
# the very module object it moved to (monkeypatching either name patches both). The public ones are named in
# the README; the rest are kept for scripts that reached inside.
MOVED_MODULES = {
    "ner.infer": "ner.inference.tagger",
    "ner.runtime": "ner.inference.runtime",
    "ner.decode": "ner.inference.decode",
    "ner.analysis": "ner.inference.analysis",
    "ner.export_onnx": "ner.inference.onnx_export",
    "ner.config": "ner.training.config",
    "ner.run": "ner.training.run",
    "ner.loop": "ner.training.loop",
    "ner.hooks": "ner.training.hooks",
    "ner.checkpoint": "ner.training.checkpoint",
    "ner.model": "ner.training.model",
    "ner.formats": "ner.data.formats",
    "ner.spans": "ner.data.spans",
    "ner.text": "ner.data.text",
    "ner.encode": "ner.data.encode",
    "ner.batching": "ner.data.batching",
    "ner.batcher": "ner.serving.batcher",
    "ner.serve_api": "ner.serving.api",
    "ner.serve_metrics": "ner.serving.metrics",
    "ner.label_studio": "ner.serving.label_studio",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module it moved to, imported under its own name."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str):
    # `from ner import Tagger` without making `import ner` (and every entry point) import torch first.
    if name == "Tagger":
        from ner.inference.tagger import Tagger

        return Tagger
    raise AttributeError(f"module 'ner' has no attribute {name!r}")
