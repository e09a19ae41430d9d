"""The README's commands, run for real with the packaged MiniLM; the CoNLL-2003 reader on the real corpus."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import ROOT, SHARED_CONLL, python_module, run_cli

README = (ROOT / "README.md").read_text(encoding="utf-8")


def setup_commands() -> list[str]:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line for line in first_block.splitlines() if line.strip()]


def test_readme_starts_with_two_setup_commands_and_ci_runs_the_second():
    main_job, tests = setup_commands()
    assert main_job.endswith("python -m ner.train") and "pip install" in main_job
    assert tests.endswith("python -m pytest -q")
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.slow
def test_the_main_job_trains_the_packaged_minilm_and_exports_a_pipeline_model(tmp_path):
    """README line 1's `python -m ner.train`, shortened with --max-steps so the suite stays fast."""
    command = setup_commands()[0].split("&&")[-1].split()
    assert command == ["python", "-m", "ner.train"]
    out = tmp_path / "run"
    result = run_cli([sys.executable, *command[1:], "--max-steps", "12", "--output-dir", str(out), "--quiet",
                      "--save-total-limit", "1"], env={"OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training on the shipped sample" in result.stderr
    assert "--learning-rate auto: 0.0002 (hidden size 384)" in result.stderr
    metrics = json.loads((out / "final" / "metrics.json").read_text())
    assert set(metrics["test"]["per_type"]) == {"LOC", "MISC", "ORG", "PER"}
    (checkpoint,) = (out / "checkpoints").glob("step_12")
    losses = json.loads((checkpoint / "trainer_state.json").read_text())["train_state"]["step_losses"]
    assert sum(losses[-3:]) < sum(losses[:3])  # twelve updates already move a real pretrained encoder
    from transformers import pipeline

    tagger = pipeline("token-classification", model=str(out / "final"), aggregation_strategy="simple")
    assert isinstance(tagger("Maria Santos joined Harper Logistics in Lisbon ."), list)


MODULES = sorted(set(re.findall(r"python -m (ner\.\w+)", README)))


@pytest.mark.parametrize("module", MODULES)
def test_every_module_the_readme_names_has_a_working_help(module):
    result = run_cli(python_module(module, "--help"))
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.skipif(not (SHARED_CONLL / "train.txt").is_file(), reason="CoNLL-2003 not beside the project")
def test_conll2003_reads_as_iob2_with_its_four_types():
    from ner.data.conll import read_conll
    from ner.data.tags import build_label_list, detect_scheme

    train = read_conll(SHARED_CONLL / "train.txt")
    assert len(train) == 14041 and detect_scheme(train) == "iob2"
    assert build_label_list(train) == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert len(read_conll(SHARED_CONLL / "valid.txt")) == 3250 and len(read_conll(SHARED_CONLL / "test.txt")) == 3453
    first = train[0]  # the -DOCSTART- line before it is skipped, not read as a word
    assert first.words == ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
    assert first.tags == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]
    assert first.lines[0] == 3
