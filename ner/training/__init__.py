"""Training: one run on one process, from data to an exported model, over any backend (ner/backends/). May
import every group but serving and corpus tagging; nothing but the commands imports it.

    config.py      TrainConfig: every option with its default, unit and help; YAML + flags
    auto.py        the auto options (batch size, token budget, epochs, learning rate, context, casing), per device
    run.py         wiring of one run: data -> model -> prepare -> fit -> evaluate -> export
    loop.py        the one training loop, written against the Backend protocol
    hooks.py       around each update: evaluation, early stopping, checkpoints, logging
    evaluation.py  the validation and test sets, tagged sharded over the ranks
    checkpoint.py  resumable checkpoints: atomic, verified, rotated
    model.py       builders: tokenizer, model with its labels, AdamW, schedule
    export.py      a checkpoint -> a Hugging Face model folder (ONNX, static int8), replacing only its own files
    model_card.py  the export's README.md: what was trained, on what, how well, and how to load it
    plots.py       the PNG plots of a run
"""
