"""Any encoder a user names works as BERT does: each family (tests/encoders.py: cased BERT, DistilBERT, ELECTRA,
RoBERTa, XLM-R, DeBERTa-v2, ModernBERT; uncased BERT is every other test's tiny_bert) trains under Accelerate and
raw DDP, resumes, evaluates, tags raw text with exact offsets, exports to ONNX past its parity check, and serves
(/predict, corpus tagging, the Label Studio backend), on tiny random models built offline."""

from __future__ import annotations

import json

import pytest
from conftest import SERVE_PACKAGES, needs, tiny_args
from encoders import FAMILIES, build_encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ner import train as train_cli
from ner.backends import BF16, NO_MIXED_PRECISION
from ner.data.tokenizer import load_tokenizer
from ner.inference.runtimes import ONNX, TORCH

RAW = ["Angela Merkel met Emmanuel Macron in Paris on Monday.", "",
       "Shares of Acme Corp. rose 3.5% in São Paulo after O'Neill's talk \U0001F600 there."]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    return request.param, build_encoder(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def trained(family, tiny_data, tmp_path_factory):
    """(family, encoder, run folder): 6 updates under Accelerate, a checkpoint every 3."""
    name, encoder = family
    out = tmp_path_factory.mktemp(f"{name}_run") / "run"
    assert train_cli.main(tiny_args(encoder, tiny_data, out, "--max-steps", "6", "--save-steps", "3",
                                    "--casing", "auto")) == 0
    return name, encoder, out


WORD = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp", "Cf", "Co", "Cn")),
               min_size=1, max_size=8)


def test_pre_split_words_get_their_running_text_pieces(family):
    """Property, per family: the pieces of words split beforehand (is_split_into_words) are those of each
    `" " + word` in running text, for any words, as loaded for training and as exported."""
    tokenizer = load_tokenizer(str(family[1]))

    @given(st.lists(WORD, min_size=1, max_size=6))
    @settings(max_examples=40, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def same_pieces(words):
        split = tokenizer(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
        running = [i for word in words for i in tokenizer(" " + word, add_special_tokens=False)["input_ids"]]
        assert split == running, (words, tokenizer.convert_ids_to_tokens(split))

    same_pieces()


def test_each_distinct_word_tokenised_alone_gets_its_pieces_in_a_sentence(family):
    """Property, per family: encoding tokenises each distinct word once, as a one-word sequence, through the Rust
    tokenizer (encode.unique_word_pieces); every word must get the pieces the sentence-level call gives it ([UNK]
    where none)."""
    from ner.data.encode import unique_word_pieces

    tokenizer = load_tokenizer(str(family[1]))

    @given(st.lists(st.lists(WORD | st.sampled_from(["\u200b", "\u0301", "Mu\u0308nchen", "x" * 60]), max_size=6),
                    min_size=1, max_size=4))
    @settings(max_examples=40, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def same_pieces(sentences):
        encoded = tokenizer(sentences, is_split_into_words=True, add_special_tokens=False)
        pieces_of = unique_word_pieces(sorted({w for words in sentences for w in words}), tokenizer)
        for i, words in enumerate(sentences):
            expected = [[] for _ in words]
            for token_id, word_id in zip(encoded["input_ids"][i], encoded.word_ids(i)):
                expected[word_id].append(token_id)
            pieces = [pieces_of[word] for word in words]
            assert pieces == [p or [tokenizer.unk_token_id] for p in expected], (words, pieces)

    same_pieces()


def test_trains_evaluates_and_tags_raw_text_with_exact_offsets(trained, tiny_data):
    from ner.evaluate import main as evaluate_main
    from ner.inference.tagger import Tagger

    name, _, out = trained
    assert (out / "final" / "model.safetensors").is_file() and json.loads((out / "final" / "metrics.json").read_text())
    assert evaluate_main([str(out / "final"), str(tiny_data["test"])]) == 0
    tagger = Tagger(out / "final", precision=NO_MIXED_PRECISION)
    for text, result in zip(RAW, tagger.predict(RAW)):
        for entity in result["entities"]:
            assert text[entity["start"]:entity["end"]] == entity["text"] == entity["text"].strip(), (name, entity)


# --casing auto: case as token types only where the encoder lower-cases its input and has a token-type table
CASING_AUTO = {"bert-cased": "none", "distilbert": "none", "electra": "types", "roberta": "none",
               "xlm-roberta": "none", "deberta-v2": "none", "modernbert": "none"}


def test_casing_auto_resolves_per_family_and_is_recorded(trained):
    name, _, out = trained
    assert json.loads((out / "final" / "training_args.json").read_text())["casing"] == CASING_AUTO[name]


def test_resumes_and_trains_under_raw_ddp(trained, tiny_data, tmp_path):
    name, encoder, out = trained
    assert train_cli.main(tiny_args(encoder, tiny_data, out, "--max-steps", "8", "--save-steps", "3",
                                    "--casing", "auto", "--resume", "auto")) == 0
    assert json.loads((out / "final" / "training_args.json").read_text())["max_steps"] == 8
    assert train_cli.main(tiny_args(encoder, tiny_data, tmp_path / "ddp", "--max-steps", "2", "--no-eval",
                                    "--raw-ddp")) == 0


def test_exports_to_onnx_past_its_parity_check(trained, tmp_path):
    pytest.importorskip("onnxruntime")
    from ner.export import main as export_main
    from ner.inference.tagger import Tagger

    name, _, out = trained
    assert export_main([str(out / "final"), str(tmp_path / "onnx_export"), "--onnx"]) == 0, name
    torch_result = Tagger(out / "final", precision=NO_MIXED_PRECISION, runtime=TORCH).predict(RAW)
    onnx_result = Tagger(tmp_path / "onnx_export", runtime=ONNX).predict(RAW)
    for ours, theirs in zip(torch_result, onnx_result):
        assert [(e["start"], e["end"], e["type"]) for e in ours["entities"]] == [
            (e["start"], e["end"], e["type"]) for e in theirs["entities"]], name


def test_int8_rewrite_gives_each_row_its_own_scales(trained, tmp_path):
    """quantize_int8 (per-row activation scales) takes every family's graph, and a row's int8 logits are the same
    bytes alone and batched with other rows. Straight from the quantizer: the export's accuracy gate needs a
    trained model, and 6 updates of a random tiny one leave too many near-ties for it to mean anything."""
    pytest.importorskip("onnxruntime")
    import numpy as np

    from ner.export import main as export_main
    from ner.inference.onnx_export import quantize_int8
    from ner.inference.onnx_runtime import onnx_session

    name, _, out = trained
    assert export_main([str(out / "final"), str(tmp_path / "onnx_export"), "--onnx"]) == 0, name
    quantize_int8(tmp_path / "onnx_export" / "model.onnx", tmp_path / "int8.onnx")
    session = onnx_session(tmp_path / "int8.onnx")
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 60, size=(4, 12)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    feed = {i.name: inputs[i.name] for i in session.get_inputs()}
    batched = session.run(["logits"], feed)[0]
    for row in range(4):
        alone = session.run(["logits"], {k: v[row:row + 1] for k, v in feed.items()})[0]
        assert alone.tobytes() == batched[row:row + 1].tobytes(), (name, row)


def test_openvino_runs_every_family_and_a_row_keeps_its_bytes_among_other_rows(trained, tiny_data, tmp_path):
    """OpenVINO reads every family's graph (fp32 and bf16) and its static int8 model (calibrated straight, the
    gate skipped as above); in each, a row's logits are the same bytes alone and batched at the same shape."""
    pytest.importorskip("nncf")
    import numpy as np

    from ner.data.conll import read_conll
    from ner.export import main as export_main
    from ner.inference.openvino_export import quantize_static
    from ner.inference.openvino_runtime import OpenVinoRuntime

    name, _, out = trained
    folder = tmp_path / "onnx_export"
    assert export_main([str(out / "final"), str(folder), "--onnx"]) == 0, name
    static = quantize_static(folder, read_conll(tiny_data["train"]))
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 60, size=(4, 12)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    types = np.zeros_like(ids)
    for path, precision in ((folder / "model.onnx", "no"), (folder / "model.onnx", "bf16"), (static, "no")):
        runtime = OpenVinoRuntime(path, 5, precision)
        batched = runtime(ids, mask, types)
        for row in range(4):
            neighbours = np.roll(np.arange(4), -row)  # the row first, then the others: another batch, same shape
            moved = runtime(ids[neighbours], mask[neighbours], types[neighbours])
            assert moved[0].tobytes() == batched[row].tobytes(), (name, path.name, precision, row)


@needs(*SERVE_PACKAGES)
def test_serves_tags_a_corpus_and_answers_label_studio(trained, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ner.inference.tagger import Tagger
    from ner.predict import main as predict_main
    from ner.serving.app import create_app
    from ner.serving.requests import Limits

    name, _, out = trained
    tagger = Tagger(out / "final", precision=NO_MIXED_PRECISION)
    expected = tagger.predict(RAW)
    with TestClient(create_app(tagger, out / "final", Limits(), label_studio=True)) as client:
        assert client.post("/predict", json={"texts": RAW}).json() == {"results": expected}
        config = ('<View><Labels name="label" toName="text"><Label value="PER"/><Label value="LOC"/>'
                  '<Label value="ORG"/></Labels><Text name="text" value="$text"/></View>')
        studio = client.post("/label-studio/predict", json={"label_config": config,
                                                            "tasks": [{"id": 1, "data": {"text": RAW[2]}}]})
        assert studio.status_code == 200 and len(studio.json()["results"]) == 1
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(t for t in RAW if t) + "\n", encoding="utf-8")
    tagged = tmp_path / "tagged"
    assert predict_main([str(out / "final"), str(corpus), "--output-dir", str(tagged), "--quiet",
                         "--mixed-precision", NO_MIXED_PRECISION]) == 0, name
    lines = [json.loads(line) for part in sorted(tagged.glob("part-*.jsonl")) for line in part.open()]
    assert [line["entities"] for line in lines] == [r["entities"] for t, r in zip(RAW, expected) if t]


@pytest.mark.parametrize("name", ["deberta-v2", "modernbert"])
def test_bf16_on_the_cpu_trains_and_tags(name, tiny_data, tmp_path):
    """DeBERTa's attention has had dtype faults under autocast (relative-position scores built in fp32 meeting
    bf16 queries); ModernBERT's unpadded attention likewise: both train and tag in bf16 on the CPU."""
    from ner.inference.tagger import Tagger

    encoder = build_encoder(name, tmp_path / name)
    out = tmp_path / "run"
    assert train_cli.main(tiny_args(encoder, tiny_data, out, "--max-steps", "2", "--mixed-precision", BF16)) == 0
    tagger = Tagger(out / "final", precision=BF16)
    assert tagger.precision == "bf16"
    for text, result in zip(RAW, tagger.predict(RAW)):
        assert all(text[e["start"]:e["end"]] == e["text"] for e in result["entities"])
