"""ONNX export (checked against PyTorch) and the onnx / onnx-int8 runtimes of the one inference path."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from ner.backends import NO_MIXED_PRECISION
from ner.data.conll import read_conll  # noqa: E402
from ner.data.examples import Example
from ner.evaluate import main as evaluate_main  # noqa: E402
from ner.export import main as export_main  # noqa: E402
from ner.inference import cpu_threads, onnx_runtime  # noqa: E402
from ner.inference import onnx_export as export_onnx  # noqa: E402
from ner.inference.runtime import in_order  # noqa: E402
from ner.inference.runtimes import FAST_RUNTIMES_COMMAND, ONNX, ONNX_INT8, TORCH  # noqa: E402
from ner.inference.tagger import Tagger  # noqa: E402
from ner.predict import main as predict_main  # noqa: E402
from ner.serve import build_parser as serve_parser  # noqa: E402
from tests.conftest import ROOT, fitted_export, python_module, run_cli  # noqa: E402


@pytest.fixture(scope="module")
def exported(random_model, tiny_data, tmp_path_factory):
    return fitted_export(random_model, tiny_data, tmp_path_factory, "onnx_export", "--onnx", "--quantize", "int8")


def onnx_logits(path, input_ids, attention_mask):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})[0]


def test_export_parity_on_new_shapes(exported):
    """Dynamic batch and sequence axes: shapes unlike the export's, fp32 within 1e-3, int8 argmax >= 99% of
    attended tokens (random ids: no words to count)."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(exported).eval()
    torch.manual_seed(1)
    for shape in [(1, 5), (7, 40)]:
        input_ids = torch.randint(5, model.config.vocab_size, shape)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, shape[1] // 2:] = 0
        with torch.no_grad():
            reference = model(input_ids=input_ids, attention_mask=attention_mask).logits.numpy()
        mask = attention_mask.numpy().astype(bool)
        fp32 = onnx_logits(exported / "model.onnx", input_ids, attention_mask)
        assert np.abs(fp32[mask] - reference[mask]).max() <= 1e-3
        int8 = onnx_logits(exported / "model.int8.onnx", input_ids, attention_mask)
        assert (int8.argmax(-1)[mask] == reference.argmax(-1)[mask]).mean() >= 0.99


def test_each_runtime_tags_like_torch(exported, tiny_data):
    examples = read_conll(tiny_data["validation"]) + read_conll(tiny_data["test"])
    torch_tags, torch_probs = Tagger(exported, precision=NO_MIXED_PRECISION, runtime=TORCH).tag(examples)
    onnx_tags, onnx_probs = Tagger(exported, runtime=ONNX).tag(examples)
    assert onnx_tags == torch_tags
    np.testing.assert_allclose(np.concatenate(onnx_probs), np.concatenate(torch_probs), atol=1e-4)
    int8_tags, _ = Tagger(exported, runtime=ONNX_INT8).tag(examples)
    flat = [(a, b) for s, t in zip(torch_tags, int8_tags) for a, b in zip(s, t)]
    assert sum(a == b for a, b in flat) / len(flat) >= 0.99


def test_predict_runtime_flag_reaches_the_runtime(exported, tiny_data, capsys):
    outputs = {}
    for runtime in (TORCH, ONNX):
        assert predict_main([str(exported), str(tiny_data["test"]), "--conll", "--quiet",
                             "--mixed-precision", NO_MIXED_PRECISION, "--runtime", runtime]) == 0
        outputs[runtime] = capsys.readouterr().out
    assert outputs[ONNX] == outputs[TORCH] and outputs[TORCH].count("\n") == 11
    assert serve_parser().parse_args([str(exported), "--runtime", ONNX_INT8]).runtime == ONNX_INT8


def test_predict_with_no_runtime_runs_what_auto_picks_for_the_cpu_class(exported, tiny_data, monkeypatch, capsys):
    """An export with model.onnx and model.int8.onnx on an AVX2-only CPU: auto is per-token int8, the measured
    fastest there, and tags as --runtime onnx-int8 does."""
    from ner.inference import runtime_choice

    monkeypatch.setattr(runtime_choice, "this_cpu_class", lambda: "avx2")
    assert runtime_choice.choose("avx2", exported).runtime == ONNX_INT8
    outputs = {}
    for runtime in ((), ("--runtime", ONNX_INT8)):
        assert predict_main([str(exported), str(tiny_data["test"]), "--conll", "--quiet", *runtime]) == 0
        outputs[runtime] = capsys.readouterr().out
    assert outputs[()] == outputs[("--runtime", ONNX_INT8)] and outputs[()].count("\n") == 11


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_missing_onnx_file_names_the_export_command(random_model, tiny_data, capsys):
    assert predict_main([str(random_model), str(tiny_data["test"]), "--conll", "--runtime", ONNX_INT8]) == 2
    err = one_line_error(capsys)
    assert "model.int8.onnx: not found" in err and FAST_RUNTIMES_COMMAND.format(model="MODEL_DIR") in err


@pytest.mark.parametrize("main", [predict_main, evaluate_main], ids=["predict", "evaluate"])
def test_corrupt_onnx_file_is_a_one_line_error(main, exported, tiny_data, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    (broken / "model.onnx").write_bytes(b"not a protobuf at all" * 10)
    assert main([str(broken), str(tiny_data["test"]), "--runtime", ONNX]) == 2
    assert "model.onnx: not a readable ONNX model" in one_line_error(capsys)


@pytest.mark.parametrize("setting, value, says", [("MAX_LOGIT_DIFF", -1.0, "differs from PyTorch"),
                                                   ("MIN_INT8_WORD_AGREEMENT", 1.01, "int8 ONNX model agrees"),
                                                   ("MIN_INT8_ENTITY_AGREEMENT", 1.01, "int8 ONNX model agrees")])
def test_export_that_fails_its_check_leaves_nothing(exported, tmp_path, monkeypatch, capsys, setting, value, says):
    monkeypatch.setattr(export_onnx, setting, value)
    out = tmp_path / "out"
    assert export_main([str(exported), str(out), "--onnx", "--quantize", "int8"]) == 2
    assert says in one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_graph_wrong_only_at_another_shape_is_refused(exported, tmp_path, monkeypatch, capsys):
    """Right on the traced batch (12 rows), off on the 3-row batch of another width: the export is refused."""
    run = export_onnx.run_session

    def wrong_at_three_rows(path, inputs):
        logits = run(path, inputs)
        return logits + 0.5 if inputs["input_ids"].shape[0] == 3 else logits

    monkeypatch.setattr(export_onnx, "run_session", wrong_at_three_rows)
    assert export_main([str(exported), str(tmp_path / "out"), "--onnx"]) == 2
    err = one_line_error(capsys)
    assert "differs from PyTorch: max |logit difference| 5.00e-01" in err and "(batch of 3 x " in err
    assert list(tmp_path.iterdir()) == []


def test_check_shapes_differ_from_the_traced_batch(exported):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported)
    batches = export_onnx.check_batches(tokenizer, casing=True)
    shapes = [b["input_ids"].shape for b in batches]
    types = batches[0]["token_type_ids"]  # the traced batch: casing types at each word's subwords
    assert types[0, 1] == 2 and types[7, 1] == 3 and types[4, 2] == 1  # Angela, EU, happened; [CLS] unknown: 0
    assert types[:, 0].tolist() == [0] * len(types)
    assert "token_type_ids" not in export_onnx.check_batches(tokenizer, casing=False)[0]
    assert shapes[0][0] == len(export_onnx.CHECK_SENTENCES) and len(set(shapes)) == len(shapes)
    assert len({shape[1] for shape in shapes}) == len(shapes)  # other batch sizes and other widths
    assert not batches[1]["attention_mask"].all()  # padded rows of different lengths
    assert [int(b["first_subwords"].sum()) for b in batches[1:]] == [
        sum(len(export_onnx.CHECK_SENTENCES[i].split()) for i in rows) for rows in export_onnx.CHECK_SHAPES]


def test_int8_agreement_counts_words_and_entity_words_apart():
    """[CLS] O O [SEP] pad with a disagreement on [CLS], [SEP] and a continuation: not counted."""
    outside, per = 0, 1
    reference = np.eye(3)[[[0, 0, per, per, 0, 0]]]  # logits: [CLS] O B-PER I-PER(cont.) [SEP] pad
    first = np.array([[False, True, True, False, False, False]])
    assert export_onnx.int8_agreement(export_onnx.word_tags(np.eye(3)[[[2, 0, per, 2, 2, 2]]], first),
                                      export_onnx.word_tags(reference, first), outside) == (1.0, 1.0, 1)
    flipped = export_onnx.word_tags(np.eye(3)[[[0, 0, 0, per, 0, 0]]], first)  # the entity word lost
    assert export_onnx.int8_agreement(flipped, export_onnx.word_tags(reference, first), outside) == (0.5, 0.0, 1)
    all_o = export_onnx.word_tags(np.eye(3)[[[0, 0, 0, 0, 0, 0]]], first)
    assert export_onnx.int8_agreement(all_o, all_o, outside) == (1.0, None, 0)


def test_export_source_must_be_a_checkpoint_or_an_export(random_model, tmp_path, capsys):
    assert export_main([str(random_model), str(tmp_path / "out"), "--onnx"]) == 2
    assert "neither a checkpoint" in one_line_error(capsys)


GPU_AND_CPU = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize("available, device, providers, runs_on", [
    (GPU_AND_CPU, "cuda", GPU_AND_CPU, "cuda"),
    (GPU_AND_CPU, "cuda:1", GPU_AND_CPU, "cuda"),
    (GPU_AND_CPU, None, GPU_AND_CPU, "cuda"),  # no device asked for: the GPU onnxruntime has, as torch's default
    (GPU_AND_CPU, "cpu", ["CPUExecutionProvider"], "cpu"),
    (["AzureExecutionProvider", "CPUExecutionProvider"], "cuda", ["CPUExecutionProvider"], "cpu"),
    (["AzureExecutionProvider", "CPUExecutionProvider"], None, ["CPUExecutionProvider"], "cpu"),
    (["CPUExecutionProvider"], "mps", ["CPUExecutionProvider"], "cpu"),
])
def test_onnx_provider_follows_the_device_where_onnxruntime_has_it(available, device, providers, runs_on):
    assert onnx_runtime.onnx_providers(device, available) == providers
    assert onnx_runtime.runs_on(providers) == runs_on


@pytest.mark.parametrize("device, providers, options", [
    ("cuda:1", GPU_AND_CPU, [{"device_id": "1"}, {}]),  # a corpus process's own GPU
    ("cuda", GPU_AND_CPU, [{}, {}]),
    (None, GPU_AND_CPU, [{}, {}]),
    ("cuda:1", ["CPUExecutionProvider"], [{}]),  # no GPU provider: nothing to number
])
def test_an_onnx_session_runs_on_the_gpu_index_asked_for(device, providers, options):
    assert onnx_runtime.provider_options(device, providers) == options


@pytest.mark.parametrize("omp, torch_threads, quota, expected", [
    ("3", 16, 2.0, 3),     # the user's OMP_NUM_THREADS wins (torch reads it too)
    (None, 16, 2.5, 3),    # torch's count, capped by a 2.5-CPU quota (rounded up)
    ("", 4, None, 4),      # no quota: torch's count
    ("0", 8, None, 8),     # not a thread count: ignored
    ("two", 1, 0.2, 1),    # at least one thread
])
def test_onnx_threads_follow_omp_num_threads_then_torch_within_the_quota(omp, torch_threads, quota, expected):
    assert cpu_threads.onnx_threads(omp, torch_threads, quota) == expected


def test_cgroup_cpu_quota_reads_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cpu_threads.cgroup_cpu_quota(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_threads.cgroup_cpu_quota(v2) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_threads.cgroup_cpu_quota(tmp_path / "v1") == 2.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_threads.cgroup_cpu_quota(tmp_path / "v1") is None
    assert cpu_threads.cgroup_cpu_quota(tmp_path / "nowhere") is None


def test_onnx_session_takes_the_thread_count_and_says_when_a_gpu_is_not_used(exported, monkeypatch, caplog):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    session = onnx_runtime.onnx_session(exported / "model.onnx")
    assert session.get_session_options().intra_op_num_threads == 1
    # idle threads sleep: spinning ones took the cores a loaded machine's passes needed (docs/performance.md)
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    monkeypatch.setattr("onnxruntime.get_available_providers", lambda: ["CPUExecutionProvider"])
    gpu = onnx_runtime.onnx_session(exported / "model.onnx", "cuda")
    assert gpu.get_providers() == ["CPUExecutionProvider"]
    assert "ONNX runs on the CPU" in caplog.text


def test_an_onnx_tagger_says_the_device_its_passes_run_on(exported, monkeypatch, caplog):
    """A GPU onnxruntime has no provider for: the tagger and its runtime say the CPU (which picks the batch budget),
    and the log says it once."""
    caplog.set_level("WARNING")
    monkeypatch.setattr("onnxruntime.get_available_providers", lambda: ["CPUExecutionProvider"])
    tagger = Tagger(exported, runtime=ONNX, device="cuda:1")
    assert tagger.device == tagger.runtime.device_type == "cpu"
    warnings = [r.getMessage() for r in caplog.records if "runs on the CPU" in r.getMessage()]
    assert len(warnings) == 1 and "ONNX runs on the CPU, not on cuda:1" in warnings[0], warnings


def test_a_cpu_session_runs_without_the_skip_layer_norm_fusion_and_a_gpu_one_with_it(exported, monkeypatch):
    """onnxruntime's fused SkipLayerNormalization was the slowest operator but one of the int8 pass on the CPU
    (docs/performance.md); a GPU provider keeps every fusion."""
    import onnxruntime

    asked = []
    real = onnxruntime.InferenceSession
    monkeypatch.setattr("onnxruntime.InferenceSession",
                        lambda *a, **kw: asked.append(kw.get("disabled_optimizers")) or real(*a, **kw))
    onnx_runtime.onnx_session(exported / "model.int8.onnx")
    assert "SkipLayerNormFusion" in asked[-1]
    monkeypatch.setattr("onnxruntime.get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr("onnxruntime.InferenceSession", lambda *a, **kw: asked.append(kw.get("disabled_optimizers")))
    onnx_runtime.onnx_session(exported / "model.int8.onnx", "cuda")
    assert asked[-1] is None


# ----------------------------------------------------------------------------- without torch

NO_TORCH = """
import importlib.abc, importlib.machinery, sys

class NoTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    \"\"\"torch looks installed (find_spec finds it) and fails to import, as a deployment without it would.\"\"\"

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name.split(".")[0] == "torch" else None

    def create_module(self, spec):
        raise ImportError(f"{spec.name} is blocked (sitecustomize of the no-torch test)")

    def exec_module(self, module):
        pass

sys.meta_path.insert(0, NoTorch())
"""

SERVE_ONCE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from fastapi.testclient import TestClient
    from ner.inference.tagger import Tagger
    from ner.serving.app import create_app
    model_dir, runtime, text = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    with TestClient(create_app(Tagger(model_dir, runtime=runtime), model_dir)) as client:
        answer = client.post("/predict", json={"text": text}).json()
    print(json.dumps({"answer": answer, "torch_imported": "torch" in sys.modules}))
""")


def run_without_torch(args: list[str], blocked: bool, hook_dir) -> str:
    """stdout of `args` in a subprocess; `blocked`: with a sitecustomize that makes `import torch` raise."""
    path = os.pathsep.join(([str(hook_dir)] if blocked else []) + [str(ROOT)])
    done = run_cli(args, env={"PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("runtime", [ONNX, ONNX_INT8])
def test_onnx_runtimes_tag_and_serve_without_torch(runtime, exported, tiny_data, tmp_path):
    """ner.predict and a served app with an ONNX runtime: torch unimportable, the same answers as with it
    importable, and torch never imported where it could be."""
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    texts = tmp_path / "texts.txt"
    texts.write_text("Ada Lovelace visited London on Monday .\nShares of Globex rose in Paris after Alan Turing "
                     "spoke .\n", encoding="utf-8")
    predict = python_module("ner.predict", str(exported), str(texts), "--runtime", runtime, "--quiet")
    with_torch = run_without_torch(predict, False, tmp_path)
    assert run_without_torch(predict, True, tmp_path) == with_torch and with_torch.count("\n") == 2
    serve = [sys.executable, "-c", SERVE_ONCE, str(exported), runtime, "Grace Hopper hired Alan Turing in Cairo ."]
    blocked, importable = (json.loads(run_without_torch(serve, b, tmp_path)) for b in (True, False))
    assert blocked["answer"] == importable["answer"] and blocked["answer"]["entities"]
    assert importable["torch_imported"] is False


class ShapeLog:
    """A runtime that records the (rows, width) of every forward it runs."""

    def __init__(self, runtime):
        self.runtime, self.shapes = runtime, []
        self.num_labels, self.device_type = runtime.num_labels, runtime.device_type

    def __call__(self, input_ids, attention_mask, token_type_ids=None):
        self.shapes.append(input_ids.shape)
        return self.runtime(input_ids, attention_mask, token_type_ids)

    def map(self, batches):
        return in_order(self, batches)


def same_width_neighbours(tagger, text: str) -> list[str]:
    """Texts of exactly `text`'s subword count with other words in them (numbers, capitals, rare words), so the
    fixed-shape plan puts them into `text`'s forward."""
    words = text.split()
    width = len(tagger.tokenizer(words, is_split_into_words=True)["input_ids"])
    fillers = ["1997", "GLOBEX", "zzyzx", "Berlin", "%", "Qatar", "999,999", "the", "Umbrella"]
    candidates = [" ".join(words[:i] + [f] + words[i + 1:]) for i in range(len(words)) for f in fillers]
    return [c for c in candidates if len(tagger.tokenizer(c.split(), is_split_into_words=True)["input_ids"]) == width]


def test_int8_answer_does_not_depend_on_its_batch_neighbours(exported):
    """int8 quantizes each activation row by row, so a text batched into one forward with other texts gets the
    numbers it gets alone. Byte for byte: entities with scores, and the tag probabilities themselves."""
    tagger = Tagger(exported, runtime=ONNX_INT8)
    tagger.runtime = ShapeLog(tagger.runtime)
    text = "Shares of Globex rose in Paris after Alan Turing spoke ."
    neighbours = same_width_neighbours(tagger, text)[:6]
    assert len(neighbours) >= 4
    alone = tagger.predict([text])[0]
    among = tagger.predict(neighbours[:3] + [text] + neighbours[3:])[3]
    assert max(rows for rows, _ in tagger.runtime.shapes[1:]) >= len(neighbours) + 1  # one forward held them all
    assert alone["entities"] and among == alone
    words = [Example(t.split(), ["O"] * len(t.split()), "t") for t in neighbours + [text]]
    _, probs_alone = tagger.tag(words[-1:])
    _, probs_among = tagger.tag(words)
    assert probs_among[-1].tobytes() == probs_alone[0].tobytes()


def test_int8_graph_keeps_no_per_tensor_activation_scale(exported):
    """Every DynamicQuantizeLinear (a scale over the whole batch tensor) is gone, and every integer MatMul reads a
    row-quantized activation with the weight scale alone, its row scale applied after it."""
    import onnx

    graph = onnx.load(str(exported / "model.int8.onnx")).graph
    ops = [node.op_type for node in graph.node]
    assert "DynamicQuantizeLinear" not in ops and "MatMulInteger" not in ops
    assert ops.count("MatMulIntegerToFloat") >= 6 and ops.count("QuantizeLinear") >= 3
    assert all(node.input[2] == "row_q_one" for node in graph.node if node.op_type == "MatMulIntegerToFloat")


# ----------------------------------------------------------------------------- what a partial export reports

def test_the_summary_lists_only_files_written_when_the_fp32_step_is_refused(exported, tmp_path, monkeypatch):
    """The fp32 graph fails its gate: model.int8.onnx, made from it, is not written either, and the summary says so.
    Before, the summary listed it as written, read off the plan (every runtime not refused) rather than the export."""
    from ner.training.export import export_fast_runtimes

    monkeypatch.setattr(export_onnx, "MAX_LOGIT_DIFF", -1.0)
    out = tmp_path / "out"
    report = export_fast_runtimes(exported, out, [], runtimes=(ONNX, ONNX_INT8))
    assert not {"model.onnx", "model.int8.onnx"} & {p.name for p in out.iterdir()}
    wrote = next(line for line in report.splitlines() if ": wrote " in line)
    assert "model.int8.onnx" not in wrote and "no runtime file" in wrote, report
    assert "refused model.int8.onnx, model.onnx" in report, report


def test_a_bug_in_a_writer_is_raised_not_reported_as_a_refusal(exported, tmp_path, monkeypatch):
    """Only a gate's own refusal lets the export go on without the file; any other error is a bug: raised, and the
    export leaves nothing. Before, every Exception read as "refused" and the run ended 0."""
    from ner.training.export import export_fast_runtimes

    def broken(source, target):
        raise RuntimeError("a bug in the int8 writer")

    monkeypatch.setattr(export_onnx, "quantize_int8", broken)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="a bug in the int8 writer"):
        export_fast_runtimes(exported, out, [], runtimes=(ONNX, ONNX_INT8))
    assert not out.exists()
