"""--runtime auto: the CPU class read from /proc/cpuinfo's flags, the pick per class among the export's files and the
installed packages, the log line, an explicit --runtime winning, the GPU probe (without torch, on any /dev/nvidiaN),
the Python API's default, a swap resolving auto for the new folder, and ner.evaluate's record of the pick."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ONNX_PACKAGES, OPENVINO_PACKAGES, needs

from ner.cpu import cpu_class, cpu_flags, this_cpu_class
from ner.inference import runtime_choice
from ner.inference.runtime_choice import RUNTIME_ORDER, accelerator_present, choose, resolve_runtime
from ner.inference.runtimes import (
    AUTO_RUNTIME,
    FAST_RUNTIMES_FLAG,
    ONNX,
    ONNX_INT8,
    OPENVINO,
    OPENVINO_INT8,
    RUNTIME_CHOICES,
    RUNTIME_FILES,
    RUNTIME_PACKAGES,
    RUNTIMES,
    TORCH,
)

# /proc/cpuinfo's flags of each class, trimmed to what decides
FLAGS = {
    "amx": "fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8",
    "avx512-vnni-bf16": "fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16",
    "avx512-vnni": "fpu sse2 avx avx2 avx512f avx512_vnni",
    "avx2": "fpu sse2 avx avx2 fma",
}
ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 asimddp\n"


def everything_installed(name):
    return object()


def folder_with(tmp_path: Path, runtimes) -> Path:
    """A model folder holding the files of `runtimes` (contents do not matter to the choice)."""
    folder = tmp_path / "model"
    folder.mkdir()
    for runtime in runtimes:
        for name in RUNTIME_FILES[runtime]:
            (folder / name).write_bytes(b"x")
    return folder


@pytest.mark.parametrize("expected", sorted(FLAGS))
def test_the_cpu_class_follows_the_flags_in_cpuinfo(expected):
    cpuinfo = f"processor\t: 0\nmodel name\t: some CPU\nflags\t\t: {FLAGS[expected]}\n\nprocessor\t: 1\n"
    assert cpu_class(cpu_flags(cpuinfo), "x86_64") == expected


def test_arm_is_told_by_its_machine_and_its_features_are_read():
    assert "asimddp" in cpu_flags(ARM_CPUINFO)
    assert cpu_class(cpu_flags(ARM_CPUINFO), "aarch64") == "arm"
    assert cpu_class(frozenset(), "x86_64") == "avx2"  # nothing read: the most conservative order


def test_avx512_without_vnni_orders_as_avx2():
    """int8 without VNNI is what makes OpenVINO's static int8 slow (the AVX2 row), so AVX-512 F alone (Skylake-SP)
    and the 256-bit AVX-VNNI get the measured AVX2 order."""
    assert cpu_class(frozenset({"avx2", "avx512f", "avx512bw", "avx512_bf16"}), "x86_64") == "avx2"
    assert cpu_class(frozenset({"avx2", "avx_vnni"}), "x86_64") == "avx2"


def test_every_class_orders_every_runtime_once():
    for order in RUNTIME_ORDER.values():
        assert sorted(runtime for runtime, _ in order) == sorted(RUNTIMES)


@pytest.mark.parametrize("device_class,with_every_file", [
    ("amx", OPENVINO), ("avx512-vnni-bf16", OPENVINO_INT8), ("avx512-vnni", OPENVINO_INT8),
    ("avx2", ONNX_INT8), ("arm", ONNX_INT8), ("gpu", TORCH)])
def test_with_every_file_each_class_gets_its_measured_fastest(tmp_path, device_class, with_every_file):
    folder = folder_with(tmp_path, RUNTIMES)
    choice = choose(device_class, folder, everything_installed)
    assert choice.runtime == with_every_file and choice.faster == ()


@pytest.mark.parametrize("device_class,files,expected", [
    ("avx2", (ONNX,), OPENVINO),  # model.onnx serves openvino (2.73x) before onnx (2.62x) on AVX2
    ("avx2", (OPENVINO_INT8,), TORCH),  # static int8 is the slowest there: torch fp32 beats it
    ("avx512-vnni-bf16", (ONNX, ONNX_INT8), OPENVINO),
    ("amx", (ONNX_INT8,), ONNX_INT8),
    ("avx512-vnni-bf16", (), TORCH)])
def test_the_pick_is_the_fastest_the_files_allow(tmp_path, device_class, files, expected):
    choice = choose(device_class, folder_with(tmp_path, files), everything_installed)
    assert choice.runtime == expected
    order = [runtime for runtime, _ in RUNTIME_ORDER[device_class]]
    assert [runtime for runtime, _, _ in choice.faster] == order[:order.index(expected)]


def test_a_runtime_whose_package_is_missing_is_passed_over_with_its_install_line(tmp_path):
    folder = folder_with(tmp_path, RUNTIMES)
    choice = choose("avx512-vnni-bf16", folder, lambda name: None if name == "openvino" else object())
    assert choice.runtime == ONNX_INT8
    assert [(runtime, fix) for runtime, _, fix in choice.faster] == [
        (OPENVINO_INT8, 'pip install -e ".[openvino]"'), (OPENVINO, 'pip install -e ".[openvino]"')]


@needs(*ONNX_PACKAGES, *OPENVINO_PACKAGES)
def test_the_log_line_says_what_why_and_which_export_would_be_faster(tmp_path, monkeypatch, caplog):
    folder = folder_with(tmp_path, (ONNX,))
    monkeypatch.setattr(runtime_choice, "this_cpu_class", lambda: "avx2")
    with caplog.at_level(logging.INFO, logger="ner"):
        assert resolve_runtime(AUTO_RUNTIME, folder, "cpu") == OPENVINO
    [line] = [r.getMessage() for r in caplog.records if "--runtime auto" in r.getMessage()]
    assert line.startswith("--runtime auto: openvino (x86 without VNNI")
    assert "2.73x a pipeline" in line
    assert f"onnx-int8 would be faster here (3.53x a pipeline): python -m ner.export {folder} {folder} " \
           f"{FAST_RUNTIMES_FLAG} --calibrate TRAIN_FILE" in line


def test_an_explicit_runtime_always_wins_and_says_nothing(tmp_path, monkeypatch, caplog):
    folder = folder_with(tmp_path, RUNTIMES)
    monkeypatch.setattr(runtime_choice, "this_cpu_class", lambda: "avx2")
    with caplog.at_level(logging.INFO, logger="ner"):
        for runtime in RUNTIMES:
            assert resolve_runtime(runtime, folder, "cpu") == runtime
    assert not caplog.records


@needs(*ONNX_PACKAGES)
def test_a_gpu_device_picks_torch_and_a_cpu_device_its_class(tmp_path, monkeypatch):
    folder = folder_with(tmp_path, RUNTIMES)
    monkeypatch.setattr(runtime_choice, "this_cpu_class", lambda: "avx2")
    assert resolve_runtime(AUTO_RUNTIME, folder, "cuda:1") == TORCH
    assert resolve_runtime(AUTO_RUNTIME, folder, "cpu") == ONNX_INT8


# Hides torch from every import finder of the interpreter it runs in, as an install without torch: find_spec finds
# nothing and `import torch` fails. Then says what auto picks on macOS (where the accelerator probe asks torch).
AUTO_WITHOUT_TORCH = textwrap.dedent("""
    import sys
    from pathlib import Path

    class WithoutTorch:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch":
                return None
            return self.finder.find_spec(name, path, target)

        def __getattr__(self, name):
            return getattr(self.finder, name)

    sys.meta_path[:] = [WithoutTorch(finder) for finder in sys.meta_path]
    from ner.inference.runtime_choice import resolve_runtime
    sys.platform = "darwin"
    print(resolve_runtime("auto", Path(sys.argv[1])), "torch" in sys.modules)
""")


def test_auto_without_torch_picks_among_the_other_runtimes_on_macos(tmp_path):
    """macOS always counts as having an accelerator, so the probe would ask torch which device it runs on: without
    torch installed it must not, and auto picks what the CPU's order allows without torch's packages."""
    folder = folder_with(tmp_path, RUNTIMES)
    expected = choose(this_cpu_class(), folder,
                      lambda name: None if name in RUNTIME_PACKAGES[TORCH] else importlib.util.find_spec(name))
    if expected.runtime == TORCH:
        pytest.skip("no runtime but torch's is installed here")
    done = subprocess.run([sys.executable, "-c", AUTO_WITHOUT_TORCH, str(folder)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [expected.runtime, "False"]


def test_a_gpu_is_seen_by_any_nvidia_node_not_the_first_only(tmp_path, monkeypatch):
    """A container given GPU 3 may hold /dev/nvidia3 alone; the driver's control nodes say nothing of a GPU."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (dev / node).touch()
    monkeypatch.setattr(runtime_choice, "DEV", dev)
    monkeypatch.setattr(runtime_choice.sys, "platform", "linux")
    assert not accelerator_present()
    for node in ("nvidia3", "kfd", "dxg"):  # NVIDIA's GPU 3, ROCm, WSL's GPU
        (dev / node).touch()
        assert accelerator_present(), node
        (dev / node).unlink()


def test_auto_is_the_default_of_every_command_that_tags(random_model):
    from ner.evaluate import build_parser as evaluate_parser
    from ner.predict import build_parser as predict_parser
    from ner.serve import build_parser as serve_parser

    assert RUNTIME_CHOICES == (AUTO_RUNTIME, *RUNTIMES)
    for parser, extra in ((predict_parser, []), (evaluate_parser, ["x.conll"]), (serve_parser, [])):
        assert parser().parse_args([str(random_model), *extra]).runtime == AUTO_RUNTIME


@pytest.fixture(scope="module")
def onnx_export(random_model, tmp_path_factory) -> Path:
    """The tiny model exported with model.onnx: the file two fast runtimes (onnx, openvino) read."""
    pytest.importorskip("onnxruntime")
    from ner.export import main as export_main

    source = shutil.copytree(random_model, tmp_path_factory.mktemp("auto_onnx_src") / "final")
    (source / "training_args.json").write_text(json.dumps({"max_seq_length": 32}), encoding="utf-8")
    out = tmp_path_factory.mktemp("auto_onnx") / "exported"
    assert export_main([str(source), str(out), "--onnx"]) == 0
    return out


@needs(*ONNX_PACKAGES, *OPENVINO_PACKAGES)  # then auto runs model.onnx before torch on every CPU class
def test_the_python_api_is_auto_by_default_and_tags_as_ner_predict(onnx_export, tmp_path, capsys, monkeypatch):
    """Tagger and RayTagger, given no runtime, run what ner.predict runs on the same folder (docs/prediction.md
    promises its output): a fast runtime where the export has one's files, not torch. As on a host without a GPU,
    where auto would pick torch whatever the default."""
    from ner.corpus import RayTagger
    from ner.inference.tagger import Tagger
    from ner.predict import main as predict_main

    monkeypatch.setattr(runtime_choice, "device_class_of", lambda device, real=runtime_choice.device_class_of:
                        real(device or "cpu"))
    expected = resolve_runtime(AUTO_RUNTIME, onnx_export)
    assert expected != TORCH
    tagger = Tagger(onnx_export)
    assert tagger.runtime_name == expected and RayTagger(str(onnx_export)).tagger.runtime_name == expected
    texts = ["Ada Lovelace visited London on Monday .", "Grace Hopper hired Alan Turing in Cairo ."]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert predict_main([str(onnx_export), str(tmp_path / "texts.txt"), "--quiet"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == tagger.predict(texts)


@needs(*ONNX_PACKAGES, *OPENVINO_PACKAGES)  # then auto runs model.onnx before torch on every CPU class
def test_a_swap_runs_what_auto_picks_for_the_new_folder(onnx_export, random_model, tmp_path, monkeypatch):
    """A Label Studio swap (like()) to an export without the fast runtime's files runs what auto allows there
    (torch), and a swap back runs the fast one again: auto is resolved per folder, not pinned by the first."""
    from ner.inference.tagger import Tagger

    torch_only = shutil.copytree(random_model, tmp_path / "final")
    for device_class in ("avx2", "amx"):
        monkeypatch.setattr(runtime_choice, "this_cpu_class", lambda device_class=device_class: device_class)
        fast = choose(device_class, onnx_export).runtime
        assert fast != TORCH
        tagger = Tagger(onnx_export, runtime=AUTO_RUNTIME, device="cpu")
        assert tagger.runtime_name == fast
        swapped = tagger.like(torch_only)
        assert swapped.runtime_name == TORCH and swapped.like(onnx_export).runtime_name == fast


def test_evaluate_json_records_the_runtime_and_whether_auto_chose_it(onnx_export, tiny_data, tmp_path):
    """The scores depend on the runtime that computed them: --json names it, and says where auto picked it."""
    from ner.evaluate import main as evaluate_main

    report = tmp_path / "report.json"
    for flags, runtime, by_auto in (([], resolve_runtime(AUTO_RUNTIME, onnx_export), True),
                                    (["--runtime", TORCH], TORCH, False)):
        assert evaluate_main([str(onnx_export), str(tiny_data["test"]), "--json", str(report), *flags]) == 0
        written = json.loads(report.read_text())
        assert (written["runtime"], written["runtime_auto"]) == (runtime, by_auto)


def test_ner_predict_says_on_stderr_what_auto_picked(random_model, tmp_path, capsys):
    from ner.predict import main as predict_main

    texts = tmp_path / "texts.txt"
    texts.write_text("Ada Lovelace visited London .\n", encoding="utf-8")
    assert predict_main([str(random_model), str(texts)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("--runtime auto:")]
    assert len(said) == 1 and said[0].startswith("--runtime auto: torch (")
    assert predict_main([str(random_model), str(texts), "--quiet", "--runtime", TORCH]) == 0
    assert "--runtime auto" not in capsys.readouterr().err


def test_the_flag_that_writes_every_runtimes_files_is_one_name_on_both_commands():
    """ner.train's flag comes from TrainConfig.export_int8, ner.export's from FAST_RUNTIMES_FLAG: the same name."""
    from ner.training.config import build_parser as train_parser

    assert train_parser().parse_args([FAST_RUNTIMES_FLAG]).export_int8 is True


def test_one_reader_of_cpu_features():
    """/proc/cpuinfo is read in ner/cpu.py alone: torch's bf16 default, OpenVINO's precision and the CPU class ask
    it, so they cannot disagree about one machine."""
    root = Path(__file__).resolve().parents[1]
    readers = sorted(str(path.relative_to(root)) for path in root.glob("ner/**/*.py")
                     if "cpuinfo" in path.read_text(encoding="utf-8"))
    assert readers == ["ner/cpu.py"]
