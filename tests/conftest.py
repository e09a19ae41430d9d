"""Offline fixtures: a tiny random BERT (config + vocabulary written here) and tiny CoNLL files."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from ner.backends import NO_MIXED_PRECISION
from ner.data.batching import NO_TOKEN_BUDGET

ROOT = Path(__file__).resolve().parents[1]
SHARED_CONLL = ROOT.parent / "shared" / "data" / "conll2003"


def needs(*packages: str) -> pytest.MarkDecorator:
    """Skip a test where the install lacks `packages`: .ci/run runs the suite on partial installs too (the core
    install, `.[serve,onnx]`), where a test of what such an install lacks cannot run."""
    lacking = [package for package in packages if importlib.util.find_spec(package) is None]
    return pytest.mark.skipif(bool(lacking), reason=f"not installed: {', '.join(lacking)}")


SERVE_PACKAGES = ("fastapi", "uvicorn", "prometheus_client", "httpx")  # the serve extra's, and its test client's
ONNX_PACKAGES = ("onnx", "onnxruntime")
OPENVINO_PACKAGES = ("openvino", "nncf")


@pytest.fixture(scope="session", autouse=True)
def private_tokenization_cache(tmp_path_factory) -> Path:
    """Tests never write the user's cache: `--tokenization-cache auto` and every subprocess use a temporary one."""
    folder = tmp_path_factory.mktemp("ner_cache")
    previous = os.environ.get("NER_CACHE_DIR")
    os.environ["NER_CACHE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("NER_CACHE_DIR", None)
    else:
        os.environ["NER_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def root_logging_as_it_was():
    """An entry point run in-process (train, serve, plot) sets the root logger up for its process; the next test
    starts without it, as the next process would, so what a test sees on stderr does not hang on test order.
    Only handlers the test added go (pytest adds and removes its own capture handlers per phase)."""
    import logging

    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in before and not type(h).__module__.startswith("_pytest")]:
        root.removeHandler(handler)
    root.setLevel(level)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: skipped, with the reason shown, where there is none."""
    import torch

    if torch.cuda.is_available():
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Marie Curie", "Niels Bohr", "Emmy Noether"]
PLACES = ["London", "Paris", "New York", "Berlin", "Lisbon", "Cairo"]
ORGS = ["Acme Corp", "Globex", "Initech", "Umbrella Group", "Stark Industries"]
TEMPLATES = [
    "{PER} visited {LOC} on Monday .",
    "{ORG} hired {PER} in {LOC} .",
    "Shares of {ORG} rose in {LOC} after {PER} spoke .",
    "{PER} said the weather was fine .",
    "Nothing happened today .",
]


def make_sentences(count: int, seed: int, long_every: int = 0) -> list[list[tuple[str, str]]]:
    """Deterministic tagged sentences; every `long_every`-th one is ~60 words (forces windows)."""
    rng = random.Random(seed)
    sentences = []
    for i in range(count):
        template = TEMPLATES[i % len(TEMPLATES)]
        if long_every and i % long_every == long_every - 1:
            template = " ; ".join(TEMPLATES[:4] * 2)
        sentence: list[tuple[str, str]] = []
        for piece in template.split():
            if piece.startswith("{"):
                kind = piece[1:4]
                name = rng.choice({"PER": PEOPLE, "LOC": PLACES, "ORG": ORGS}[kind]).split()
                sentence += [(w, ("B-" if j == 0 else "I-") + kind) for j, w in enumerate(name)]
            else:
                sentence.append((piece, "O"))
        sentences.append(sentence)
    return sentences


def write_conll(path: Path, sentences: list[list[tuple[str, str]]]) -> Path:
    blocks = ["\n".join(f"{w} NN O {t}" for w, t in s) for s in sentences]
    path.write_text("-DOCSTART- -X- -X- O\n\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def _vocabulary() -> list[str]:
    words = {w.lower() for t in TEMPLATES for w in t.split() if not w.startswith("{")}
    words |= {w.lower() for name in PEOPLE + PLACES + ORGS for w in name.split()}
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,;:'\"()-")
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(words), *chars, *[f"##{c}" for c in chars]]


def build_tiny_bert(folder: Path, dropout: float, hidden_size: int = 32) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(_vocabulary()) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(folder)
    config = BertConfig(vocab_size=len(_vocabulary()), hidden_size=hidden_size, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=128,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    import torch

    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """Tiny random BERT with dropout on (to check that RNG streams line up too)."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), dropout=0.1)


@pytest.fixture(scope="session")
def tiny_bert_no_dropout(tmp_path_factory) -> Path:
    """For multi-process comparisons: each rank draws its own dropout masks, so turn dropout off."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert_nodrop"), dropout=0.0)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny_data")
    return {"train": write_conll(folder / "train.conll", make_sentences(48, seed=1, long_every=12)),
            # 13 sentences: divides neither by 2 processes nor by any batch size used here
            "validation": write_conll(folder / "valid.conll", make_sentences(13, seed=2, long_every=6)),
            "test": write_conll(folder / "test.conll", make_sentences(11, seed=3))}


@pytest.fixture(scope="session")
def random_model(tiny_bert, tiny_data, tmp_path_factory) -> Path:
    """An untrained head on the tiny BERT: plenty of mistakes to report, built in a second."""
    return with_random_head(tiny_bert, tiny_data, tmp_path_factory.mktemp("random_model"))


@pytest.fixture(scope="session")
def wide_random_model(tiny_data, tmp_path_factory) -> Path:
    """random_model with hidden size 256: its bf16 numbers move with the batch shape by more than the 4 decimals
    of a served score (hidden 32 moves them by ~6e-5 only), so batch-independence checks can fail on it."""
    encoder = build_tiny_bert(tmp_path_factory.mktemp("wide_bert"), dropout=0.0, hidden_size=256)
    return with_random_head(encoder, tiny_data, tmp_path_factory.mktemp("wide_random_model"))


def with_random_head(encoder: Path, tiny_data: dict[str, Path], folder: Path) -> Path:
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from ner.data.conll import read_conll
    from ner.data.tags import build_label_list

    labels = build_label_list(read_conll(tiny_data["train"]))
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(
        encoder, num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)})
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
    return folder


def fit_briefly(model_dir, train_file, steps: int = 60) -> None:
    """A few updates on the tiny data: a random head puts many tokens on a tie, where int8 noise flips the
    argmax far more often than on any trained model (98.7% agreement measured untrained)."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from ner.data.conll import read_conll

    model = AutoModelForTokenClassification.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    examples = read_conll(train_file)
    batch = tokenizer([e.words for e in examples], is_split_into_words=True, padding=True, return_tensors="pt")
    labels = torch.tensor([[model.config.label2id[e.tags[w]] if w is not None else -100 for w in batch.word_ids(i)]
                           for i, e in enumerate(examples)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
        optimizer.step()
    model.eval().save_pretrained(model_dir)


def fitted_export(random_model: Path, tiny_data: dict[str, Path], tmp_path_factory, name: str, *flags: str) -> Path:
    """The tiny model, briefly fitted (the int8 gates need a model with few ties), as an export with 32-token windows
    (long sentences are windowed), written by ner.export with `flags`."""
    from ner.export import main as export_main

    source = tmp_path_factory.mktemp(f"{name}_src") / "final"
    shutil.copytree(random_model, source)
    fit_briefly(source, tiny_data["train"])
    (source / "training_args.json").write_text(json.dumps({"max_seq_length": 32, "decode": "viterbi"}))
    out = tmp_path_factory.mktemp(f"{name}_out") / "exported"
    assert export_main([str(source), str(out), *flags]) == 0
    return out


def tiny_args(model: Path, data: dict[str, Path], out_dir: Path, *extra: str) -> list[str]:
    """Flags for a fast, fp32, fully reproducible run on the tiny model."""
    return ["--model", str(model), "--train-file", str(data["train"]), "--validation-file", str(data["validation"]),
            "--test-file", str(data["test"]), "--output-dir", str(out_dir), "--max-seq-length", "32",
            "--batch-size", "4", "--max-tokens", str(NO_TOKEN_BUDGET), "--num-epochs", "2", "--learning-rate", "1e-3",
            "--mixed-precision", NO_MIXED_PRECISION, "--quiet", "--seed", "7", *extra]


def run_cli(args: list[str], timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command with the test environment: offline, single-threaded BLAS per process."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def read_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainer_state.json").read_text())


def resolve(spec: dict, schema: dict) -> dict:
    """An OpenAPI `schema` with its $ref into the document's components followed, recursively."""
    if "$ref" in schema:
        return resolve(spec, spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]])
    return {k: [resolve(spec, s) for s in v] if k in ("oneOf", "anyOf") else
            {name: resolve(spec, p) for name, p in v.items()} if k == "properties" else
            resolve(spec, v) if k == "items" else v for k, v in schema.items()}


@contextmanager
def torch_threads(count: int):
    """This process's torch on `count` threads, as OMP_NUM_THREADS=count gives a new process (run_cli: 1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
