"""What an exported model folder says about itself: how it was trained (training_args.json), its labels and
length limit (config.json, read as JSON: AutoConfig imports torch in transformers 5), and its version."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ner.data.encode import CASING_SCHEME
from ner.errors import UserError
from ner.files import sha256_file
from ner.inference.options import MAX_SEQ_LENGTH, WINDOW_STRIDE_WORDS


@dataclass(frozen=True)
class ModelSettings:
    """How an export was trained, so inference encodes and decodes the same way (training_args.json)."""

    max_seq_length: int = MAX_SEQ_LENGTH
    window_stride_words: int = WINDOW_STRIDE_WORDS
    context: str = "none"  # document | none, as resolved at training
    context_tokens: int = 0
    casing: str = "none"  # types | none, as resolved at training
    casing_scheme: str = CASING_SCHEME  # recorded, so that a scheme of a newer version is refused
    tag_scheme: str | None = None
    decode: str = "viterbi"
    min_score: str | None = None

    @classmethod
    def of(cls, model_dir: Path) -> ModelSettings:
        path = model_dir / "training_args.json"
        if not path.is_file():  # a folder made by other tools: sentence level, scheme from the labels
            return cls()
        saved = read_model_json(path)
        names = [f.name for f in dataclasses.fields(cls)]
        settings = cls(**{name: saved[name] for name in names if saved.get(name) is not None})
        if settings.casing == "types" and settings.casing_scheme != CASING_SCHEME:
            raise UserError(f"{path}: casing_scheme {settings.casing_scheme!r} is not one this version of ner "
                            f"knows ({CASING_SCHEME}); a newer version wrote it")
        return settings


def max_positions(config: dict, tokenizer) -> int | None:
    """Tokens a window may hold: the position embeddings, or the tokenizer's limit where smaller (RoBERTa's
    config counts 514 positions, 2 of them reserved; its tokenizer says 512)."""
    positions = config.get("max_position_embeddings")
    stated = getattr(tokenizer, "model_max_length", None)
    if positions is None or not stated or stated > positions:
        return positions
    return stated


def read_model_json(path: Path) -> dict:
    """A model folder's JSON file; unreadable: a one-line error."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not readable JSON ({exc})") from None


def model_labels(config: dict) -> dict[int, str]:
    """id2label as transformers' PretrainedConfig reads it from config.json (LABEL_i where none is named)."""
    named = config.get("id2label")
    if named:
        return {int(k): v for k, v in named.items()}
    return {i: f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))}


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.onnx")


def model_version(model_dir: Path) -> str:
    """The one name of an export, in ner.predict's Label Studio tasks and in ner.serve's answers: its folder
    name (with the parent where it is OUTPUT_DIR/final) and a short hash of its weights, so two models are
    told apart, and a model retrained into the same place gets a new version."""
    model_dir = Path(model_dir)
    weights = next((model_dir / name for name in WEIGHT_FILES if (model_dir / name).is_file()),
                   model_dir / "config.json")
    folder = model_dir.resolve()
    name = f"{folder.parent.name}/{folder.name}" if folder.name == "final" else folder.name
    return f"{name}@{sha256_file(weights)[:8]}"
