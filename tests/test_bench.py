"""The benchmarks' pure pieces on tiny inputs: FLOPs and loop arithmetic, the per-update shapes read
from metrics.jsonl (one tiny training run), slicing, evaluation timing's batch rule, report rendering."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import python_module, run_cli, tiny_args

from benchmarks import baseline, eval_speed, measure, report, training_speed
from ner.backends import NO_MIXED_PRECISION
from ner.errors import UserError
from scripts import sweep_defaults

SHAPE = {"matmul_params": 10, "layers": 1, "hidden": 3}


def test_matmul_params_counts_attention_ffn_and_head():
    # MiniLM-L6-H384: 6 x (4 x 384^2 + 2 x 384 x 1536) + 384 x 9
    assert measure.matmul_params(384, 6, 1536, 9) == 6 * (4 * 147456 + 2 * 589824) + 3456 == 10_620_288


def test_train_flops_is_6pt_plus_quadratic_attention():
    # one batch of 2 rows x 4 tokens, P = 10, 1 layer, hidden 3: 2 x (6 x 10 x 4 + 12 x 3 x 16)
    assert measure.train_flops([4], [2], params=10, layers=1, hidden=3) == 2 * (240 + 576)
    assert measure.train_flops([4, 2], [2, 1], 10, 1, 3) == 2 * (240 + 576) + (120 + 144)


def test_computed_flops_use_padded_width_and_real_flops_the_mean_real_length():
    shapes = [[2, 4, 6], [1, 2, 2]]  # [rows, padded width, real tokens]
    assert measure.computed_flops(shapes, SHAPE) == measure.train_flops([4, 2], [2, 1], 10, 1, 3)
    assert measure.real_flops(shapes, SHAPE) == measure.train_flops([3, 2], [2, 1], 10, 1, 3)


def test_padding_efficiency_and_mfu():
    assert measure.padding_efficiency(30, 40) == 0.75
    assert measure.padding_efficiency(0, 0) == 0.0
    assert measure.mfu(flops=1e12, seconds=2.0, peak_flops_per_s=1e12) == 0.5
    assert measure.mfu(1e12, 0.0, 1e12) == 0.0


def test_loop_window_skips_the_first_update():
    assert measure.loop_window([10.0, 11.0, 13.5]) == (1, 2, 3.5)
    assert measure.loop_window([10.0]) == (0, 0, 0.0)


def test_updates_from_records_skips_evaluations_and_keeps_every_ranks_batches():
    records = [{"time": 5.0, "step": 1, "loss": 0.9, "batch_shapes": [[2, 4, 6], [2, 8, 9]]},
               {"time": 6.0, "step": 2, "loss": 0.8, "batch_shapes": [[1, 4, 3], [3, 4, 10]]},
               {"time": 6.5, "step": 2, "eval": {"f1": 0.5}},
               {"time": 7.0, "step": 3, "loss": 0.7, "batch_shapes": [[1, 4, 4]]}]
    step_times, steps = measure.updates_from_records(records)
    assert step_times == [5.0, 6.0, 7.0]
    assert steps == [[[2, 4, 6], [2, 8, 9]], [[1, 4, 3], [3, 4, 10]], [[1, 4, 4]]]


def test_updates_from_records_refuses_records_that_cover_several_updates():
    records = [{"time": 5.0, "step": 2, "loss": 0.9, "batch_shapes": [[2, 4, 6]]},
               {"time": 6.0, "step": 4, "loss": 0.8, "batch_shapes": [[1, 4, 3]]}]
    with pytest.raises(ValueError, match="--logging-steps 1"):
        measure.updates_from_records(records)


def test_summarise_loop_counts_only_timed_updates_for_rates():
    steps = [[[2, 4, 6]], [[1, 3, 3]], [[2, 5, 6], [1, 2, 2]]]  # update 3: two micro-batches
    loop = measure.summarise_loop(steps, [0.0, 1.0, 3.0], SHAPE, peak=1e3)
    assert loop["steps"] == 3 and loop["timed_steps"] == 2 and loop["loop_s"] == 3.0
    assert loop["real_tokens_epoch"] == 17 and loop["computed_tokens_epoch"] == 23
    assert loop["padding_efficiency"] == pytest.approx(17 / 23)
    assert loop["loop_real_tokens_per_s"] == pytest.approx((3 + 6 + 2) / 3.0)
    assert loop["loop_computed_tokens_per_s"] == pytest.approx((3 + 10 + 2) / 3.0)
    computed = measure.train_flops([3, 5, 2], [1, 2, 1], 10, 1, 3)
    real = measure.train_flops([3, 3, 2], [1, 2, 1], 10, 1, 3)
    assert loop["mfu_computed"] == pytest.approx(computed / 3.0 / 1e3)
    assert loop["mfu_real"] == pytest.approx(real / 3.0 / 1e3)


@pytest.fixture(scope="module")
def tiny_run(tiny_bert, tiny_data, tmp_path_factory) -> Path:
    """One tiny training run as the bench runs ner.train: --logging-steps 1 (here two micro-batches per update)."""
    out = tmp_path_factory.mktemp("bench") / "run"
    extra = ("--logging-steps", "1", "--gradient-accumulation-steps", "2",
             "--num-epochs", "4", "--learning-rate", "3e-3")  # enough updates for a validation F1 above 0.2
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, *extra)))
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_steps_from_a_training_runs_metrics_cover_every_window_of_every_epoch(tiny_run, tiny_bert, tiny_data):
    from ner.data.conll import read_conll
    from ner.data.encode import encode_examples
    from ner.data.tags import build_label_list
    from ner.data.tokenizer import load_tokenizer

    out = tiny_run
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_times, steps = measure.updates_from_records(records)
    args = json.loads((out / "final" / "training_args.json").read_text())
    assert len(steps) == len(step_times) == json.loads((out / "final" / "metrics.json").read_text())["global_step"]
    examples = read_conll(tiny_data["train"])
    label2id = {t: i for i, t in enumerate(build_label_list(examples))}
    features = encode_examples(examples, load_tokenizer(str(tiny_bert)), label2id, args["max_seq_length"],
                               args["window_stride_words"], args["label_all_subwords"])
    shapes = [shape for step in steps for shape in step]
    assert sum(rows for rows, _, _ in shapes) == args["num_epochs"] * len(features)
    assert sum(real for _, _, real in shapes) == args["num_epochs"] * sum(len(f.input_ids) for f in features)
    assert all(real <= rows * width for rows, width, real in shapes)
    assert max(len(step) for step in steps) == 2


def test_baseline_records_update_shapes_as_metrics_jsonl_does():
    import torch

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(1))

        def forward(self, attention_mask, **_):
            return SimpleNamespace(loss=(self.weight * attention_mask.sum()).sum())

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    loader = [{"attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}, {"attention_mask": torch.tensor([[1, 0]])}]
    step_times, steps = baseline.baseline_train(model, loader, optimizer, scheduler,
                                                              torch.device("cpu"))
    assert steps == [[[2, 3, 5]], [[1, 2, 1]]] and len(step_times) == 2


def test_slices_are_the_first_sentences_read_by_the_project_reader(tmp_path):
    from ner.data.conll import read_conll

    conll_dir = tmp_path / "conll"
    conll_dir.mkdir()
    text = ("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
            "Peter NNP B-NP B-PER\n\nBonn NNP B-NP B-LOC\n")
    for split in ("train", "valid"):
        (conll_dir / f"{split}.txt").write_text(text, encoding="utf-8")
    args = argparse.Namespace(conll_dir=conll_dir, sentences=2, valid_sentences=1)
    train, valid = training_speed.prepare_slices(args, tmp_path / "work")
    assert [(e.words, e.tags) for e in read_conll(train)] == [(["EU", "rejects"], ["B-ORG", "O"]),
                                                              (["Peter"], ["B-PER"])]
    assert [e.words for e in read_conll(valid)] == [["EU", "rejects"]]
    swept = sweep_defaults.slice_conll(conll_dir / "train.txt", tmp_path / "sweep.conll", 2)
    assert swept.read_text(encoding="utf-8") == train.read_text(encoding="utf-8")


def test_the_bench_scores_an_export_as_its_training_run_did(tiny_run, tiny_data):
    from ner.data.conll import read_conll

    trained = json.loads((tiny_run / "final" / "metrics.json").read_text())["validation"]["f1"]
    scored = eval_speed.score_export(tiny_run / "final", read_conll(tiny_data["validation"]))
    assert trained > 0.2 and scored["f1"] == pytest.approx(trained, abs=1e-9) and scored["eval_added_s"] > 0


def test_timed_evaluate_uses_the_runs_evaluation_batch_rule():
    from ner.data.examples import Example

    calls = []

    class Tagger:
        def tag(self, examples, max_sentences, max_tokens):
            calls.append((max_sentences, max_tokens))
            return [e.tags for e in examples], None

    examples = [Example(["EU", "rejects"], ["B-ORG", "O"], "x"), Example(["Peter"], ["B-PER"], "x")]
    result = eval_speed.timed_evaluate(Tagger(), {"batch_size": 5, "max_tokens": 200}, examples)
    eval_speed.timed_evaluate(Tagger(), {"batch_size": 5, "max_tokens": 300}, examples)
    # twice the run's training limits (not the defaults), as its evaluation used, tokens capped at 512 a pass
    assert calls == [(10, 400), (10, 512)]
    assert result["f1"] == 1.0 and result["sentences_per_s"] > 0


def test_markdown_table_aligns_numbers_and_marks_missing():
    table = report.markdown_table(["run", "tok/s", "F1", "eff."], [["a", 1234.5, None, "45.5%"], ["b", 2.0, "x", "-"]])
    assert table.splitlines() == ["| run | tok/s | F1 | eff. |", "|---|---:|---|---:|",
                                  "| a | 1,234.50 | - | 45.5% |", "| b | 2.00 | x | - |"]


def test_ratios_and_targets():
    base = {"wall_s": 300.0, "cpu_s": 580.0, "loop_s": 240.0, "loop_real_tokens_per_s": 400.0,
            "process_real_tokens_per_s": 300.0, "peak_rss_bytes": 2e9, "f1": 0.80}
    ours = {"wall_s": 90.0, "eval_added_s": 10.0, "cpu_s": 190.0, "loop_s": 60.0, "loop_real_tokens_per_s": 1600.0,
            "process_real_tokens_per_s": 900.0, "peak_rss_bytes": 1e9, "f1": 0.797}
    ratios = report.ratio_rows(ours, base)
    assert ratios["process speed-up (baseline s / ours s)"] == 3.0  # 300 / (90 + 10)
    assert ratios["loop speed-up (baseline s / ours s)"] == 4.0
    assert ratios["loop real tokens/s ratio"] == 4.0
    assert ratios["F1 difference (points)"] == pytest.approx(-0.3)
    main = {"runs": {"baseline": base, "ours (default)": ours}, "ratios": ratios}
    ablations = {"default, warm tokenisation cache": {"f1": 0.80}, "fp32 (--mixed-precision no)": {"f1": 0.81}}
    rows = report.targets(main, ablations)
    assert [row[2] for row in rows] == ["met", "met", "met", "**missed**"]  # bf16 is 1.0 point below fp32
    assert rows[3][1] == "-1.00 points"


def test_render_report_has_every_section():
    run = {"wall_s": 10.0, "cpu_s": 19.0, "loop_s": 8.0, "loop_real_tokens_per_s": 100.0, "padding_efficiency": 0.5,
           "steps": 3, "peak_rss_bytes": 1.5e9, "f1": 0.5, "mfu_computed": 0.1, "mfu_real": 0.05, "precision": "bf16"}
    bench = {"device": "cpu", "torch": "x", "threads": 2, "peak": {"fp32_flops_per_s": 2e11, "bf16_flops_per_s": 1e12},
             "main": {"train_sentences": 5, "valid_sentences": 3, "runs": {"baseline": run, "ours (default)": run},
                      "ratios": report.ratio_rows(run, run), "settings": [["seed", "42", "42"]]},
             "ablations": {"default, warm tokenisation cache": run},
             "inference": {"one sentence at a time (HF model, fp32)": {"seconds": 2.0, "sentences_per_s": 1.5}},
             "scaling": {"1 process x 2 threads": run}, "full_memory": {**run, "note": "NOTE"}}
    text = report.render_report(bench)
    for heading in ("## Matmul peak", "## One epoch, 5 train sentences", "### Targets", "## Ablations",
                    "## Inference", "## Scaling", "## Full train set", "NOTE"):
        assert heading in text
    assert "| baseline | 10.0 | 19.0 | 8.0 | 100 |" in text
    assert "| fp32 | 0.20 | 0.00 |" in text and "| bf16 | 1.00 | 0.00 |" in text
    assert "Warning" not in text


def test_bf16_peak_is_measured_only_where_the_cpu_has_bf16_units(monkeypatch):
    """Emulated bf16 took minutes for the 4096^3 product on an AVX2-only CPU, where nothing runs in bf16."""
    import torch

    import ner.backends

    monkeypatch.setattr(ner.backends, "cpu_supports_bf16", lambda: False)
    peaks = measure.measure_peak_flops(torch.device("cpu"), threads=1, size=32, reps=1)
    assert set(peaks) == {"fp32_flops_per_s", "fp32_wall_flops_per_s"}
    assert measure.peak_for(peaks, "fp32") == peaks["fp32_flops_per_s"]
    assert measure.peak_for(peaks, "bf16") != measure.peak_for(peaks, "bf16")  # nan: not measured, not zero
    assert "| fp32 |" in "\n".join(report.peak_part(peaks)) and "| bf16 |" not in "\n".join(report.peak_part(peaks))
    monkeypatch.setattr(ner.backends, "cpu_supports_bf16", lambda: True)
    assert "bf16_flops_per_s" in measure.measure_peak_flops(torch.device("cpu"), threads=1, size=32, reps=1)


def test_save_report_keeps_earlier_sections(tmp_path):
    report.save_report({"device": "cpu", "peak": {"fp32_flops_per_s": 1e11, "bf16_flops_per_s": 2e11}}, tmp_path)
    merged = report.load_report(tmp_path / "bench.json")
    merged["inference"] = {"one sentence at a time (HF model, fp32)": {"seconds": 1.0, "sentences_per_s": 9.0}}
    report.save_report(merged, tmp_path)
    text = (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert "## Matmul peak" in text and "## Inference" in text


def test_contention_share_and_warning(monkeypatch):
    monkeypatch.setattr(measure.os, "cpu_count", lambda: 2)
    busy = {"wall_s": 10.0, "other_cpu_s": 5.0}
    assert measure.contention(busy) == 0.25
    assert measure.contention({}) == 0.0
    bench = {"main": {"train_sentences": 1, "valid_sentences": 1, "runs": {"baseline": busy, "ours (default)": busy},
                      "ratios": {}, "settings": []}}
    assert "**Warning:**" in report.render_report(bench)


def test_the_bench_refuses_an_out_folder_of_the_users_and_leaves_it_alone(tmp_path, capsys):
    users = tmp_path / "results"
    (users / "runs" / "ours").mkdir(parents=True)
    (users / "runs" / "ours" / "notes.txt").write_text("mine")
    assert training_speed.main(["--out", str(users), "--no-main"]) == 2
    assert "--out holds files this benchmark did not write" in capsys.readouterr().err
    assert (users / "runs" / "ours" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in users.iterdir()) == ["runs"]  # nothing added either


def test_the_bench_replaces_only_folders_it_made(tmp_path):
    out = training_speed.claim_out(tmp_path / "bench_out")
    made = training_speed.fresh_dir(out / "runs" / "ours")
    (made / "metrics.jsonl").write_text("old run")
    assert sorted(p.name for p in training_speed.fresh_dir(made).iterdir()) == [training_speed.MARKER]
    users = out / "runs" / "ablation_0"  # put there by hand: no marker
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="ablation_0: was not made by this benchmark"):
        training_speed.fresh_dir(users)
    assert (users / "notes.txt").read_text() == "mine"
    assert training_speed.claim_out(out) == out  # an earlier run's OUT is taken again


def test_train_phases_add_up_to_the_fixed_cost_and_count_only_the_saves_after_the_last_update():
    from benchmarks import startup

    stamps = {"imports": 102.0, "calls": {"prepare_data": [[102.5, 103.0]], "build_model": [[103.0, 105.0]],
                                          "save": [[107.0, 108.0], [111.0, 112.0], [112.0, 112.0]],
                                          "export_checkpoint": [[113.0, 113.5]], "finish": [[110.0, 114.0]]}}
    bounds = startup.boundaries(stamps, [106.0, 108.5, 110.0], {"start_time": 100.0, "wall_s": 15.0})
    phases = startup.phase_seconds(bounds)
    assert phases["final evaluation"] == 1.0 and phases["checkpoint"] == 1.0  # the save at 107 was in the loop
    assert phases["start-up"] == 6.0 and phases["tear-down"] == 5.0 and phases["loop (updates 2..N)"] == 4.0
    assert phases["fixed cost"] == sum(phases[name] for name, _ in startup.START_UP + startup.TEAR_DOWN) == 11.0
    line = startup.floor_line({"this checkout": [{"bounds": bounds}] * 3}, [4.0, 3.5, 9.0])
    assert "3.50, 9.00" in line and "4.00 s median" in line and "this checkout 7.00 s" in line  # 11 - 4


def test_the_floor_loads_the_model_the_measured_runs_train(tmp_path, monkeypatch):
    from benchmarks import measure, startup
    from ner.training.config import DEFAULT_MODEL
    from ner.training.model import resolve_model_path

    loaded = []
    monkeypatch.setattr(measure, "run_measured", lambda argv, *a, **k: loaded.append(argv[-1]) or {"wall_s": 1.0})
    startup.floor_run(tmp_path, ["--max-steps", "3", "--model", str(tmp_path)])
    startup.floor_run(tmp_path, [f"--model={tmp_path}"])
    startup.floor_run(tmp_path, [])
    assert loaded == [str(tmp_path), str(tmp_path), resolve_model_path(DEFAULT_MODEL)]


ENTRY_POINTS = ("training_speed", "baseline", "eval_speed", "inference", "inference_phases", "shapes", "seeds",
                "startup", "batch_independence", "text_split", "corpus_scaling", "batch_plan_before_buckets",
                "confidence", "active_learning", "batch_plans", "fp32_tail")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_each_benchmark_runs_as_a_module_from_the_checkout(name):
    result = run_cli(python_module(f"benchmarks.{name}", "--help"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:")


def test_the_package_lists_every_entry_point_and_libraries_have_none():
    import benchmarks

    modules = sorted(p.stem for p in Path(benchmarks.__file__).parent.glob("*.py") if p.stem != "__init__")
    entry_points = [m for m in modules if hasattr(importlib.import_module(f"benchmarks.{m}"), "main")]
    assert sorted(entry_points) == sorted(ENTRY_POINTS) and set(modules) - set(entry_points) == {"measure", "report"}
    assert all(f"python -m benchmarks.{m} " in benchmarks.__doc__ for m in ENTRY_POINTS)


def test_seed_summary_takes_each_type_over_the_runs_that_report_it():
    """seqeval reports a type with no gold entities only in a run that predicted it (ATIS's rare slots)."""
    from benchmarks.seeds import summarise

    def run(f1: float, per_type: dict) -> dict:
        return {"scores": {"test": {"f1": f1, "per_type": {t: {"f1": v} for t, v in per_type.items()}}}}

    summary = summarise([run(0.9, {"A": 0.9}), run(0.8, {"A": 0.7, "B": 0.0})])["test"]
    assert summary["f1"]["mean"] == pytest.approx(85.0)
    assert summary["per_type"]["A"]["mean"] == pytest.approx(80.0) and summary["per_type"]["A"]["n"] == 2
    assert summary["per_type"]["B"] == {"mean": 0.0, "std": 0.0, "n": 1}


def test_inference_flops_are_a_third_of_training_flops_row_by_row():
    """A forward is a third of forward + backward: the same 2PS + 4LdS^2 per row that train_flops triples."""
    from benchmarks.measure import inference_flops, train_flops

    model = {"matmul_params": 1000, "layers": 2, "hidden": 8}
    lengths = [3, 7, 7, 12]
    assert 3 * inference_flops(lengths, model) == train_flops([3, 7, 12], [1, 2, 1], 1000, 2, 8)
    assert inference_flops([], model) == 0


def test_inference_phases_time_every_phase_and_give_tagger_predicts_answers(random_model):
    """The phases are Tagger.predict's steps, called one at a time: the same answers, and a time for each."""
    from benchmarks.inference_phases import PHASES, timed_predict
    from ner.inference.tagger import Tagger

    tagger = Tagger(random_model, precision=NO_MIXED_PRECISION)
    texts = ["Angela Merkel met Emmanuel Macron in Paris.", "", "Shares of Acme Corp. rose 3.5% on Monday."] * 3
    seconds, results = timed_predict(tagger, texts)
    assert results == tagger.predict(texts)
    assert all(seconds[p] >= 0 and seconds[f"{p} cpu"] >= 0 for p in PHASES) and seconds["forwards"] >= 1
