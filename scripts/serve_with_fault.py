"""`python -m ner.serve` whose model raises on every batch that holds a text containing MARKER: the fault run.

    python scripts/serve_with_fault.py XFAULTX runs/ner/final --port 8000 --max-wait-ms 200
    python scripts/load_test.py runs/ner/final --fail-on XFAULTX --clients 8 --requests 1 --texts-per-request 4

The batcher then tags that batch again text by text: only the request holding the marker should get 500.
"""

from __future__ import annotations

import sys

import ner.inference.tagger
from ner.serve import main


def failing_on(marker: str, predict):
    def predict_or_fail(self, texts, *args, **kwargs):
        if any(marker in text for text in texts):
            raise RuntimeError(f"injected failure: a text holds {marker!r}")
        return predict(self, texts, *args, **kwargs)
    return predict_or_fail


if __name__ == "__main__":
    ner.inference.tagger.Tagger.predict = failing_on(sys.argv[1], ner.inference.tagger.Tagger.predict)
    sys.exit(main(sys.argv[2:]))
