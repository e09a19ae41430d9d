"""OpenVINO runtimes: `openvino` over model.onnx, `openvino-int8` over the static int8 model the export calibrates."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from ner.backends import BF16, NO_MIXED_PRECISION
from ner.data.conll import read_conll  # noqa: E402
from ner.data.examples import Example
from ner.export import main as export_main  # noqa: E402
from ner.inference import onnx_export  # noqa: E402
from ner.inference.runtimes import (  # noqa: E402
    FAST_RUNTIMES_COMMAND,
    FAST_RUNTIMES_FLAG,
    ONNX,
    ONNX_INT8,
    OPENVINO,
    OPENVINO_INT8,
    OPENVINO_RUNTIMES,
    RUNTIME_FILES,
    TORCH,
)
from ner.inference.tagger import Tagger  # noqa: E402
from ner.training.export import FAST_RUNTIMES  # noqa: E402
from tests.conftest import fitted_export, python_module, torch_threads  # noqa: E402
from tests.test_batch_independence import SENTENCES, RanInFp32, say_when_fp32, tagged_alone_and_mixed  # noqa: E402
from tests.test_onnx import NO_TORCH, SERVE_ONCE, run_without_torch  # noqa: E402

RUNS = [(OPENVINO, "no"), (OPENVINO, "bf16"), (OPENVINO_INT8, "no"), (OPENVINO_INT8, "bf16")]
EXAMPLES = [Example([w for w, _ in s], ["O"] * len(s), "t") for s in SENTENCES]


@pytest.fixture(scope="module")
def exported(random_model, tiny_data, tmp_path_factory):
    return fitted_export(random_model, tiny_data, tmp_path_factory, "openvino_export", "--onnx", "--quantize", "int8",
                         "--calibrate", str(tiny_data["train"]))


def test_export_writes_the_static_int8_model_and_lists_it(exported):
    listing = json.loads((exported / ".ner-record.json").read_text())
    assert {"model.int8.xml", "model.int8.bin"} <= set(listing["files"])
    assert (exported / "model.int8.bin").stat().st_size > 0


def test_openvino_fp32_tags_like_torch_and_static_int8_agrees(exported, tiny_data):
    examples = read_conll(tiny_data["validation"]) + read_conll(tiny_data["test"])
    torch_tags, torch_probs = Tagger(exported, precision=NO_MIXED_PRECISION, runtime=TORCH).tag(examples)
    tagger = Tagger(exported, runtime=OPENVINO, precision=NO_MIXED_PRECISION)
    assert tagger.precision == "no" and tagger.device == "cpu"
    tags, probs = tagger.tag(examples)
    assert tags == torch_tags
    np.testing.assert_allclose(np.concatenate(probs), np.concatenate(torch_probs), atol=1e-4)
    int8_tags, _ = Tagger(exported, runtime=OPENVINO_INT8).tag(examples)
    pairs = [(a, b) for s, t in zip(torch_tags, int8_tags) for a, b in zip(s, t)]
    assert sum(a == b for a, b in pairs) / len(pairs) >= onnx_export.MIN_INT8_WORD_AGREEMENT


def checked_precision(tagger: Tagger, asked: str, has_bf16: bool | None = None) -> str:
    """What holds on every CPU: the compiled model runs bf16 (its INFERENCE_PRECISION_HINT, read from OpenVINO)
    exactly where bf16 or auto was asked for and the CPU has BF16 (OpenVINO's own probe, unless `has_bf16` says
    otherwise: ner/cpu.py's reading must agree with it), else f32, as the tagger reports; said in the test output
    (RanInFp32) when bf16 was asked for and fp32 ran."""
    import openvino

    if has_bf16 is None:
        has_bf16 = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    expected = "bf16" if asked in ("auto", "bf16") and has_bf16 else "no"
    hint = tagger.runtime.compiled.get_property("INFERENCE_PRECISION_HINT")
    ran = "bf16" if hint == openvino.Type.bf16 else "no"
    assert ran == tagger.precision == expected and hint in (openvino.Type.bf16, openvino.Type.f32), (asked, hint)
    say_when_fp32(asked, ran)
    return ran


@pytest.mark.parametrize("runtime,precision", RUNS)
def test_a_text_gets_the_same_bytes_alone_and_among_neighbours(exported, runtime, precision):
    """Static scales and one fixed shape per width: a window's numbers never depend on what shares its forward."""
    tagger = Tagger(exported, runtime=runtime, precision=precision)
    checked_precision(tagger, precision)
    tagged_alone_and_mixed(tagger, seed=5, max_tokens=128)


@pytest.mark.parametrize("runtime", OPENVINO_RUNTIMES)
def test_bf16_on_a_cpu_without_bf16_units_runs_fp32_and_says_so(exported, runtime, monkeypatch):
    """The fp32 path of the bf16 rows above, forced on any CPU (the probe says: no BF16): the compiled model runs
    f32 and the test output says bf16 was not tested."""
    from ner.inference import openvino_runtime

    monkeypatch.setattr(openvino_runtime, "has_bf16_units", lambda: False)
    tagger = Tagger(exported, runtime=runtime, precision=BF16)
    with pytest.warns(RanInFp32, match="bf16 ran in fp32"):
        assert checked_precision(tagger, "bf16", has_bf16=False) == "no"
    tagged_alone_and_mixed(tagger, seed=5, max_tokens=128)


@pytest.mark.parametrize("runtime,precision", RUNS)
def test_each_pass_runs_on_one_thread_and_the_bytes_do_not_depend_on_the_threads(exported, runtime, precision,
                                                                                  monkeypatch):
    from ner.inference import cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the streams follow torch's threads, as on a bare machine
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_quota", lambda: None)
    answers = {}
    for threads in (1, 2):
        with torch_threads(threads):
            tagger = Tagger(exported, runtime=runtime, precision=precision)
        compiled = tagger.runtime.compiled
        assert compiled.get_property("NUM_STREAMS") == compiled.get_property("INFERENCE_NUM_THREADS") == threads
        answers[threads] = tagger.tag(EXAMPLES, max_tokens=512)[1]
    checked_precision(tagger, precision)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(answers[1], answers[2]))


def test_omp_num_threads_sets_the_streams_as_it_does_an_onnx_session(exported, monkeypatch):
    """ner.serve --workers gives each worker OMP_NUM_THREADS = its share of the cores."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with torch_threads(2):
        tagger = Tagger(exported, runtime=OPENVINO_INT8)
    assert tagger.runtime.compiled.get_property("NUM_STREAMS") == 1


@pytest.mark.parametrize("runtime", OPENVINO_RUNTIMES)
def test_a_gpu_asked_for_is_said_to_be_unused_as_onnx_says_it(exported, runtime, caplog):
    """OpenVINO runs on the CPU here: a GPU device asked for (Tagger's `device`, a corpus process's GPU) gets the
    one warning ONNX gives when it cannot use the GPU (runtime.warn_runs_on_cpu), not silence; the CPU, or no
    device, gets none."""
    caplog.set_level("WARNING")
    for quiet in (None, "cpu"):
        assert Tagger(exported, runtime=runtime, device=quiet).device == "cpu"
    assert "runs on the CPU" not in caplog.text
    tagger = Tagger(exported, runtime=runtime, device="cuda:1")
    assert tagger.device == "cpu"
    warnings = [r.getMessage() for r in caplog.records if "runs on the CPU" in r.getMessage()]
    assert len(warnings) == 1 and "OpenVINO runs on the CPU, not on cuda:1" in warnings[0], warnings


def test_precision_is_bf16_only_where_asked_for_and_the_cpu_has_it():
    from ner.inference.openvino_runtime import openvino_precision

    assert openvino_precision("auto", True) == openvino_precision("bf16", True) == "bf16"
    assert openvino_precision("no", True) == "no"
    assert openvino_precision("auto", False) == openvino_precision("bf16", False) == "no"


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    return err[-1]


def refuse_the_static_model(monkeypatch) -> None:
    """The static int8 model's gate asks for more than any model gives; model.int8.onnx's stays as it is."""
    checked = onnx_export.check_int8

    def strict_for_static(run, batches, references, outside, *what):
        if what:  # the static model's gate names itself; model.int8.onnx's does not
            monkeypatch.setattr(onnx_export, "MIN_INT8_WORD_AGREEMENT", 1.01)
        return checked(run, batches, references, outside, *what)

    monkeypatch.setattr(onnx_export, "check_int8", strict_for_static)


def test_a_static_model_that_fails_its_gate_leaves_nothing(exported, tiny_data, tmp_path, monkeypatch, capsys):
    refuse_the_static_model(monkeypatch)
    out = tmp_path / "refused"
    assert export_main([str(exported), str(out), "--onnx", "--quantize", "int8", "--calibrate",
                        str(tiny_data["train"])]) != 0
    error = one_line_error(capsys)
    assert "static int8 OpenVINO model agrees" in error and error.endswith("export without --calibrate")
    assert not out.exists()


def test_export_int8_writes_every_runtimes_files_and_says_what_auto_picks(exported, tiny_data, tmp_path, capsys):
    """One flag on ner.export: the fp32 ONNX, the per-token int8 and OpenVINO's static int8, each past its gate,
    recorded as the export's own; the report names them and what --runtime auto runs here."""
    from ner.cpu import this_cpu_class
    from ner.inference.runtime_choice import choose

    out = tmp_path / "fast"
    assert export_main([str(exported), str(out), FAST_RUNTIMES_FLAG, "--calibrate", str(tiny_data["train"])]) == 0
    names = sorted({name for runtime in FAST_RUNTIMES for name in RUNTIME_FILES[runtime]})
    assert set(names) <= set(json.loads((out / ".ner-record.json").read_text())["files"])
    err = capsys.readouterr().err
    assert f"{FAST_RUNTIMES_FLAG}: wrote {', '.join(names)} into {out}" in err and "refused" not in err
    assert f"python -m ner.predict will run --runtime {choose(this_cpu_class(), out).runtime} on this machine" in err


def test_export_int8_keeps_the_files_whose_gate_passes_and_names_the_refused(exported, tiny_data, tmp_path,
                                                                             monkeypatch, capsys):
    """The static model's gate refuses it: model.onnx and model.int8.onnx are kept, the export succeeds, and the
    refusal is named with the gate's reason."""
    refuse_the_static_model(monkeypatch)
    out = tmp_path / "partly"
    assert export_main([str(exported), str(out), FAST_RUNTIMES_FLAG, "--calibrate", str(tiny_data["train"])]) == 0
    kept = {name for runtime in (ONNX, ONNX_INT8) for name in RUNTIME_FILES[runtime]}
    assert kept <= {p.name for p in out.iterdir()} and not (out / RUNTIME_FILES[OPENVINO_INT8][0]).exists()
    assert kept <= set(json.loads((out / ".ner-record.json").read_text())["files"])
    err = capsys.readouterr().err
    assert f"{FAST_RUNTIMES_FLAG}: refused model.int8.bin, model.int8.xml (--runtime {OPENVINO_INT8}): static int8 " \
           "OpenVINO model agrees with PyTorch on" in err


def test_export_int8_calibrates_on_the_recorded_training_file_or_asks_for_one(exported, tiny_data, tmp_path,
                                                                              capsys):
    source = tmp_path / "source"
    shutil.copytree(exported, source)
    args = json.loads((source / "training_args.json").read_text())
    (source / "training_args.json").write_text(json.dumps({**args, "train_file": str(tmp_path / "gone.conll")}))
    assert export_main([str(source), str(tmp_path / "o"), FAST_RUNTIMES_FLAG]) == 2
    assert f"pass --calibrate TRAIN_FILE (the model's training record names {tmp_path / 'gone.conll'}, not found " \
           "here)" in one_line_error(capsys) and not (tmp_path / "o").exists()
    (source / "training_args.json").write_text(json.dumps({**args, "train_file": str(tiny_data["train"])}))
    assert export_main([str(source), str(source), FAST_RUNTIMES_FLAG]) == 0  # in place, on the recorded file
    assert (source / RUNTIME_FILES[OPENVINO_INT8][0]).is_file()


def test_calibrate_needs_quantize_and_a_missing_file_names_the_export(exported, tmp_path, capsys):
    assert export_main([str(exported), str(tmp_path / "o"), "--onnx", "--calibrate", "x.conll"]) != 0
    assert "--quantize int8" in one_line_error(capsys)
    assert export_main([str(exported), str(tmp_path / "o"), "--onnx", "--quantize", "int8", "--calibrate",
                        str(tmp_path / "missing.conll")]) != 0
    assert "missing.conll: file not found" in one_line_error(capsys) and not (tmp_path / "o").exists()
    bare = tmp_path / "bare"
    shutil.copytree(exported, bare, ignore=shutil.ignore_patterns("model.int8.*"))
    with pytest.raises(Exception, match="model.int8.xml: not found.*--calibrate"):
        Tagger(bare, runtime=OPENVINO_INT8)
    (bare / "model.onnx").unlink()
    with pytest.raises(Exception, match="model.onnx: not found") as refused:  # the one command for every file
        Tagger(bare, runtime=OPENVINO)
    assert str(refused.value).endswith(FAST_RUNTIMES_COMMAND.format(model="MODEL_DIR"))


@pytest.mark.parametrize("runtime", [OPENVINO, OPENVINO_INT8])
def test_openvino_runtimes_tag_and_serve_without_torch(runtime, exported, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    texts = tmp_path / "texts.txt"
    texts.write_text("Ada Lovelace visited London on Monday .\nShares of Globex rose in Paris .\n", encoding="utf-8")
    predict = python_module("ner.predict", str(exported), str(texts), "--runtime", runtime, "--quiet")
    with_torch = run_without_torch(predict, False, tmp_path)
    assert run_without_torch(predict, True, tmp_path) == with_torch and with_torch.count("\n") == 2
    serve = [sys.executable, "-c", SERVE_ONCE, str(exported), runtime, "Grace Hopper hired Alan Turing in Cairo ."]
    blocked, importable = (json.loads(run_without_torch(serve, b, tmp_path)) for b in (True, False))
    assert blocked["answer"] == importable["answer"] and importable["torch_imported"] is False


def test_corpus_tagging_writes_the_same_bytes_on_one_thread_and_on_two(exported, tmp_path):
    """The corpus path runs the runtime as predict does: a part's bytes and the pinned computation do not change
    with the threads, so a resume on another thread count is allowed and writes the same bytes."""
    from ner.predict import main as predict_main

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(" ".join(words.words) for words in EXAMPLES) + "\n", encoding="utf-8")
    outputs = {}
    for threads in (1, 2):
        with torch_threads(threads):
            out = tmp_path / f"tagged_{threads}"
            assert predict_main([str(exported), str(texts), "--runtime", OPENVINO_INT8, "--output-dir", str(out),
                                 "--merge", "--quiet"]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        outputs[threads] = (out / "predictions.jsonl").read_bytes(), manifest["computation"]
    assert outputs[1] == outputs[2] and outputs[1][1]["threads"] == 1
    assert len(outputs[1][0].splitlines()) == len(EXAMPLES)


def test_a_run_with_export_int8_ends_with_every_runtimes_files_calibrated_on_its_data(tiny_bert, tiny_data,
                                                                                      tmp_path):
    """--export-int8: OUTPUT_DIR/final gets model.onnx, model.int8.onnx and the static model.int8.xml, each past its
    gate, recorded as the export's own, and every runtime tags with them."""
    from ner.train import main as train_main
    from tests.conftest import tiny_args

    out = tmp_path / "run"
    # Without label smoothing: the tiny random model's smoothed margins are thin enough that static int8 flips 2% of
    # its words, below the gate this test is not about (the packaged MiniLM's agree on every word either way).
    assert train_main(tiny_args(tiny_bert, tiny_data, out, "--num-epochs", "12", "--learning-rate", "3e-3",
                                "--label-smoothing", "0", "--export-int8")) == 0
    final = out / "final"
    record = json.loads((final / ".ner-record.json").read_text())
    assert {"model.onnx", "model.int8.onnx", "model.int8.xml", "model.int8.bin"} <= set(record["files"])
    text = ["Ada Lovelace visited London on Monday ."]
    answers = {runtime: Tagger(final, runtime=runtime).predict(text) for runtime in (ONNX_INT8, OPENVINO_INT8)}
    assert all(len(answer) == 1 for answer in answers.values())
    examples = read_conll(tiny_data["validation"])
    by_torch = Tagger(final, precision=NO_MIXED_PRECISION, runtime=TORCH).tag(examples)[0]
    torch_tags = [t for tags in by_torch for t in tags]
    for runtime in (ONNX_INT8, OPENVINO_INT8):  # each file tags the run's own validation data as its gate asks
        tags = [t for tags in Tagger(final, runtime=runtime).tag(examples)[0] for t in tags]
        agreement = sum(a == b for a, b in zip(tags, torch_tags, strict=True)) / len(torch_tags)
        assert agreement >= onnx_export.MIN_INT8_WORD_AGREEMENT, (runtime, agreement)


def test_a_run_whose_int8_gates_refuse_ends_finished_with_its_model_and_names_the_refusals(tiny_bert, tiny_data,
                                                                                           tmp_path, monkeypatch,
                                                                                           capsys):
    """Every int8 gate refuses (a threshold no file meets): the run still exits 0 with final/ whole, model.onnx kept,
    no int8 file, and the summary names each refusal and what --runtime auto will run instead."""
    from ner.cpu import this_cpu_class
    from ner.inference.runtime_choice import choose
    from ner.train import main as train_main
    from tests.conftest import tiny_args

    monkeypatch.setattr(onnx_export, "MIN_INT8_WORD_AGREEMENT", 1.01)
    out = tmp_path / "run"
    assert train_main(tiny_args(tiny_bert, tiny_data, out, "--num-epochs", "1", FAST_RUNTIMES_FLAG)) == 0
    final = out / "final"
    present = {p.name for p in final.iterdir()}
    assert {"model.safetensors", "metrics.json", *RUNTIME_FILES[ONNX]} <= present
    assert not {name for runtime in (ONNX_INT8, OPENVINO_INT8) for name in RUNTIME_FILES[runtime]} & present
    said = capsys.readouterr().out
    assert f"{FAST_RUNTIMES_FLAG}: refused model.int8.onnx (--runtime {ONNX_INT8}): int8 ONNX model agrees" in said
    assert f"{FAST_RUNTIMES_FLAG}: refused model.int8.bin, model.int8.xml (--runtime {OPENVINO_INT8}): static" in said
    assert f"python -m ner.predict will run --runtime {choose(this_cpu_class(), final).runtime} on this" in said
    assert f"Model ready: {final}" in said


def test_export_int8_without_openvino_is_refused_before_training(monkeypatch):
    import importlib.util

    from ner.errors import UserError
    from ner.training.config import TrainConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nncf" else real(name, *a))
    with pytest.raises(UserError, match=r'--export-int8 needs .*pip install -e "\.\[openvino\]"'):
        TrainConfig(export_int8=True).validate()
    TrainConfig().validate()
