"""scripts/bench.py's arithmetic and rendering on tiny inputs (no timing, no CoNLL, no MiniLM)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matmul_params_counts_attention_ffn_and_head(bench):
    # MiniLM-L6-H384: 6 x (4 x 384^2 + 2 x 384 x 1536) + 384 x 9
    assert bench.matmul_params(384, 6, 1536, 9) == 6 * (4 * 147456 + 2 * 589824) + 3456 == 10_620_288


def test_train_flops_is_6pt_plus_quadratic_attention(bench):
    # one batch of 2 rows x 4 tokens, P = 10, 1 layer, hidden 3: 2 x (6 x 10 x 4 + 12 x 3 x 16)
    assert bench.train_flops([4], [2], params=10, layers=1, hidden=3) == 2 * (240 + 576)
    assert bench.train_flops([4, 2], [2, 1], 10, 1, 3) == 2 * (240 + 576) + (120 + 144)


def test_padding_efficiency_and_mfu(bench):
    assert bench.padding_efficiency(30, 40) == 0.75
    assert bench.padding_efficiency(0, 0) == 0.0
    assert bench.mfu(flops=1e12, seconds=2.0, peak_flops_per_s=1e12) == 0.5
    assert bench.mfu(1e12, 0.0, 1e12) == 0.0


def test_loop_window_skips_the_first_update(bench):
    assert bench.loop_window([10.0, 11.0, 13.5]) == (1, 2, 3.5)
    assert bench.loop_window([10.0]) == (0, 0, 0.0)


def test_group_steps_by_world_size(bench):
    assert bench.group_steps([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_summarise_loop_counts_only_timed_updates_for_rates(bench):
    batches = [{"rows": 2, "width": 4, "lengths": [4, 2]}, {"rows": 1, "width": 3, "lengths": [3]},
               {"rows": 2, "width": 5, "lengths": [5, 1]}]
    shape = {"matmul_params": 10, "layers": 1, "hidden": 3}
    loop = bench.summarise_loop([[b] for b in batches], [0.0, 1.0, 3.0], shape, peak=1e3)
    assert loop["steps"] == 3 and loop["timed_steps"] == 2 and loop["loop_s"] == 3.0
    assert loop["real_tokens_epoch"] == 15 and loop["computed_tokens_epoch"] == 21
    assert loop["padding_efficiency"] == pytest.approx(15 / 21)
    assert loop["loop_real_tokens_per_s"] == pytest.approx((3 + 6) / 3.0)
    assert loop["loop_computed_tokens_per_s"] == pytest.approx((3 + 10) / 3.0)
    computed = bench.train_flops([3, 5], [1, 2], 10, 1, 3)
    real = bench.train_flops([3, 5, 1], [1, 1, 1], 10, 1, 3)
    assert loop["mfu_computed"] == pytest.approx(computed / 3.0 / 1e3)
    assert loop["mfu_real"] == pytest.approx(real / 3.0 / 1e3)


def test_conll_slice_round_trip(bench, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
                      "Peter NNP B-NP B-PER\n\nBonn NNP B-NP B-LOC\n", encoding="utf-8")
    assert bench.read_conll_sentences(source) == [[("EU", "B-ORG"), ("rejects", "O")], [("Peter", "B-PER")],
                                                  [("Bonn", "B-LOC")]]
    first_two = bench.read_conll_sentences(source, limit=2)
    assert len(first_two) == 2
    written = bench.write_conll(first_two, tmp_path / "out" / "slice.conll")
    assert bench.read_conll_sentences(written) == first_two


def test_markdown_table_aligns_numbers_and_marks_missing(bench):
    table = bench.markdown_table(["run", "tok/s", "F1", "eff."], [["a", 1234.5, None, "45.5%"], ["b", 2.0, "x", "-"]])
    assert table.splitlines() == ["| run | tok/s | F1 | eff. |", "|---|---:|---|---:|",
                                  "| a | 1,234.50 | - | 45.5% |", "| b | 2.00 | x | - |"]


def test_ratios_and_targets(bench):
    base = {"wall_s": 300.0, "cpu_s": 580.0, "loop_s": 240.0, "loop_real_tokens_per_s": 400.0,
            "process_real_tokens_per_s": 300.0, "peak_rss_bytes": 2e9, "f1": 0.80}
    ours = {"wall_s": 90.0, "eval_added_s": 10.0, "cpu_s": 190.0, "loop_s": 60.0, "loop_real_tokens_per_s": 1600.0,
            "process_real_tokens_per_s": 900.0, "peak_rss_bytes": 1e9, "f1": 0.797}
    ratios = bench.ratio_rows(ours, base)
    assert ratios["process speed-up (baseline s / ours s)"] == 3.0  # 300 / (90 + 10)
    assert ratios["loop speed-up (baseline s / ours s)"] == 4.0
    assert ratios["loop real tokens/s ratio"] == 4.0
    assert ratios["F1 difference (points)"] == pytest.approx(-0.3)
    main = {"runs": {"baseline": base, "ours (default)": ours}, "ratios": ratios}
    ablations = {"default, warm tokenisation cache": {"f1": 0.80}, "fp32 (--mixed-precision no)": {"f1": 0.81}}
    rows = bench.targets(main, ablations)
    assert [row[2] for row in rows] == ["met", "met", "met", "**missed**"]  # bf16 is 1.0 point below fp32
    assert rows[3][1] == "-1.00 points"


def test_render_report_has_every_section(bench):
    run = {"wall_s": 10.0, "cpu_s": 19.0, "loop_s": 8.0, "loop_real_tokens_per_s": 100.0, "padding_efficiency": 0.5,
           "steps": 3, "peak_rss_bytes": 1.5e9, "f1": 0.5, "mfu_computed": 0.1, "mfu_real": 0.05, "precision": "bf16"}
    report = {"device": "cpu", "torch": "x", "threads": 2, "peak": {"fp32_flops_per_s": 2e11, "bf16_flops_per_s": 1e12},
              "main": {"train_sentences": 5, "valid_sentences": 3, "runs": {"baseline": run, "ours (default)": run},
                       "ratios": bench.ratio_rows(run, run), "settings": [["seed", "42", "42"]]},
              "ablations": {"default, warm tokenisation cache": run},
              "inference": {"one sentence at a time (HF model, fp32)": {"seconds": 2.0, "sentences_per_s": 1.5}},
              "scaling": {"1 process x 2 threads": run}, "full_memory": {**run, "note": "NOTE"}}
    text = bench.render_report(report)
    for heading in ("## Matmul peak", "## One epoch, 5 train sentences", "### Targets", "## Ablations",
                    "## Inference", "## Scaling", "## Full train set", "NOTE"):
        assert heading in text
    assert "| baseline | 10.0 | 19.0 | 8.0 | 100 |" in text
    assert "| fp32 | 0.20 | 0.00 |" in text and "| bf16 | 1.00 | 0.00 |" in text
    assert "Warning" not in text


def test_contention_share_and_warning(bench, monkeypatch):
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    busy = {"wall_s": 10.0, "other_cpu_s": 5.0}
    assert bench.contention(busy) == 0.25
    assert bench.contention({}) == 0.0
    report = {"main": {"train_sentences": 1, "valid_sentences": 1, "runs": {"baseline": busy, "ours (default)": busy},
                       "ratios": {}, "settings": []}}
    assert "**Warning:**" in bench.render_report(report)
