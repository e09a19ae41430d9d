"""Ray Data's offline batch inference over the one inference path: RayTagger (DEFAULT_CHUNK_TEXTS, the batch size
of its example, is ner.corpus.plan's). Imports no Ray itself.
"""

from __future__ import annotations

import json

from ner.corpus.inputs import parse_unit


class RayTagger:
    """A Tagger as the callable class Ray Data's `map_batches` takes for offline batch inference: each actor
    loads the model once, then tags batches of rows; `entities` is added as a JSON string per row (the list
    ner.predict writes), so the column holds one Arrow type whatever is found, and `confidence` (the text's, a float).
Imports no Ray itself.

        ds = ray.data.read_parquet("s3://bucket/corpus/")
        ds = ds.map_batches(RayTagger, fn_constructor_kwargs={"model_dir": "runs/ner/final"},
                            batch_size=DEFAULT_CHUNK_TEXTS, concurrency=4, num_gpus=1)
        ds.write_parquet("s3://bucket/tagged/")

    `tagger_options` are Tagger's, so the runtime is ner.predict's default (auto) unless named.
    """

    def __init__(self, model_dir: str, text_column: str = "text", batch_size: int | None = None,
                 max_tokens: int | None = None, **tagger_options) -> None:
        from ner.inference.tagger import Tagger

        self.tagger = Tagger(model_dir, **tagger_options)
        self.text_column = text_column
        self.max_sentences, self.max_tokens = batch_size, max_tokens  # None: the device's default (Tagger.tag)

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        # a missing or non-string text fails its batch with the row named, as the CLI refuses it
        texts = [parse_unit("table", f"{self.text_column} row {row} of this batch", text)["text"]
                 for row, text in enumerate(batch[self.text_column])]
        results = self.tagger.predict(texts, self.max_sentences, self.max_tokens)
        found = [json.dumps(result["entities"], ensure_ascii=False) for result in results]
        confidence = np.array([result["confidence"] for result in results], dtype=np.float64)
        return {**batch, "entities": np.array(found, dtype=object), "confidence": confidence}
