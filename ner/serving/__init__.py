"""Serving: what `python -m ner.serve` is made of. Imports inference and data, never training: retraining starts
`python -m ner.train` as a process of its own.

    app.py           the FastAPI app: routes, the Label Studio routes beside them, operations, JSON errors
    requests.py      what one request may ask, and reading it under those limits (every route reads here)
    lifecycle.py     warm-up, readiness, failure, and the drain that SIGTERM starts
    batcher.py       the micro-batcher: bounded queue, timeouts, isolation of a failing text, drain
    workers.py       --workers N: N processes on one port
    api.py           the typed surface (/openapi.json models) and the API-key checks
    metrics.py       Prometheus metrics, request ids, the access log
    label_studio.py  the Label Studio ML backend protocol: its label config, tasks, results and routes
    retrain.py       retraining from Label Studio, bounded: ner.train in a process, the swap in every worker
"""
