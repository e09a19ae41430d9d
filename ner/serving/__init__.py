"""Serving: what `python -m ner.serve` is made of. Imports inference and data, never training: retraining starts
`python -m ner.train` as a process of its own.

    batcher.py       the micro-batcher: bounded queue, timeouts, isolation of a failing text, drain
    api.py           the typed surface (/openapi.json models) and the API-key checks
    metrics.py       Prometheus metrics, request ids, the access log
    label_studio.py  the Label Studio ML backend: its routes and retraining
"""
