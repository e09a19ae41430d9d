"""TrainConfig: YAML + flag precedence, validation, and --help from both entry points."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys

import pytest
from conftest import read_state, run_cli, tiny_args

from ner import train as train_cli
from ner.backends import ACCELERATE, BACKENDS, BF16, DATA_PARALLEL, NO_MIXED_PRECISION, RAW_DDP
from ner.data.batching import NO_TOKEN_BUDGET
from ner.errors import UserError
from ner.training.checkpoint import list_checkpoints
from ner.training.config import MAY_CHANGE, MUST_MATCH, AddedLater, TrainConfig, load_yaml, parse_config, resume_rule


def test_flags_override_yaml_which_overrides_defaults(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("learning_rate: 3e-5\nbatch-size: 8\nnum_epochs: 4\n")
    cfg, _ = parse_config(["--config", str(config), "--batch-size", "16"])
    assert (cfg.learning_rate, cfg.batch_size, cfg.num_epochs) == (3e-5, 16, 4)
    assert cfg.seed == TrainConfig().seed


def test_backend_shortcuts():
    assert parse_config([])[0].backend == ACCELERATE
    assert parse_config(["--raw-ddp"])[0].backend == RAW_DDP  # the documented spellings of the shortcuts
    assert parse_config(["--data-parallel"])[0].backend == DATA_PARALLEL
    assert {parse_config(["--backend", name])[0].backend for name in BACKENDS} == set(BACKENDS)
    assert parse_config(["--raw-ddp", "--local_rank", "3"])[1].local_rank == 3
    assert parse_config(["--raw-ddp", "--local-rank=1"])[1].local_rank == 1


@pytest.mark.parametrize("text, message", [
    ("learning_rat: 1e-4\n", "c.yaml: unknown option 'learning_rat'"),
    ("batch_size: eight\n", "c.yaml: option 'batch_size' expects int, got 'eight'"),
    ("lr_scheduler: wavy\n", "c.yaml: option 'lr_scheduler' must be one of"),
    ("- a list\n", "c.yaml: expected a mapping"),
    ("a: [\n", "c.yaml:2: not valid YAML"),
])
def test_yaml_errors_name_the_file(tmp_path, text, message):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(UserError) as info:
        load_yaml(config)
    assert str(info.value).startswith(str(tmp_path / message.split(":")[0]) + ":" + message.split(":", 1)[1])


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "-1"], "--batch-size must be zero or more"),
    (["--warmup-ratio", "1.5"], "--warmup-ratio must be in [0, 1)"),
    (["--max-seq-length", "4"], "--max-seq-length 4 is too small"),
])
def test_validation(argv, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_config(argv)


CHOICE_FIELDS = [f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("choices")]


@pytest.mark.parametrize("name", CHOICE_FIELDS)
def test_validate_refuses_a_value_outside_a_fields_choices(name):
    """TrainConfig built in Python (a test, a notebook) is held to the choices that YAML and flags check."""
    choices = next(f for f in dataclasses.fields(TrainConfig) if f.name == name).metadata["choices"]
    for choice in choices:
        TrainConfig(**{name: choice}).validate()
    misspelt = choices[-1].replace("-", "_") if "-" in choices[-1] else choices[-1] + "_"
    with pytest.raises(UserError, match=f"^--{name.replace('_', '-')} must be one of .* \\(got '{misspelt}'\\)$"):
        TrainConfig(**{name: misspelt}).validate()


def test_max_seq_length_range_names_the_value_and_the_bounds():
    from ner.inference.options import check_max_seq_length

    check_max_seq_length(8)
    check_max_seq_length(512, max_positions=512)
    with pytest.raises(UserError, match=r"--max-seq-length 7 is too small.*use 8 or more, up to 512\)"):
        check_max_seq_length(7, max_positions=512)
    with pytest.raises(UserError, match=r"--max-seq-length 513 is longer than the model's 512 positions \(use 8 to"):
        check_max_seq_length(513, max_positions=512)


REQUIRED_FLAGS = ["--model", "--train-file", "--validation-file", "--test-file", "--output-dir", "--num-epochs",
                  "--max-steps", "--batch-size", "--gradient-accumulation-steps", "--learning-rate", "--warmup-ratio",
                  "--weight-decay", "--lr-scheduler", "--max-seq-length", "--seed", "--mixed-precision",
                  "--eval-steps", "--save-steps", "--no-eval", "--config", "--raw-ddp", "--data-parallel",
                  "--resume", "--save-total-limit", "--dist-timeout", "--overwrite-output-dir", "--trust-remote-code"]


@pytest.mark.parametrize("entry", [["ner/train.py"], ["-m", "ner.train"]])
def test_help_lists_every_flag_with_its_default(entry):
    result = run_cli([sys.executable, *entry, "--help"])
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for flag in REQUIRED_FLAGS:
        assert flag in text
    assert f"(default: {TrainConfig().learning_rate})" in text
    assert f"(default: {TrainConfig().seed})" in text
    assert "--max-tokens INT" in text and "|auto" not in text
    assert f"16384 on CUDA (reasoned, docs/defaults.md); {NO_TOKEN_BUDGET}: none, fixed --batch-size (default: 0)" \
        in text


def test_auto_defaults_follow_the_measured_rules():
    from ner.training.auto import auto_learning_rate, auto_num_epochs

    assert auto_num_epochs(29) == 10  # the shipped sample: ~29 updates an epoch
    assert auto_num_epochs(300) == 5
    assert auto_num_epochs(880) == 3  # CoNLL-2003 train at 16 sentences a batch
    assert auto_num_epochs(439) == 4  # ... and at 32, the default
    assert auto_learning_rate(384) == 2e-4 and auto_learning_rate(768) == 5e-5


def test_auto_values_resolve_into_a_new_config_once(caplog):
    from ner.training.auto import resolve_auto

    caplog.set_level("INFO", logger="ner")
    given = TrainConfig()
    resolved = resolve_auto(given, hidden_size=768, sentences_per_window=1.0,
                            updates_per_epoch=lambda b, t: 9600 // b, device_type="cpu")
    assert (resolved.batch_size, resolved.max_tokens, resolved.learning_rate, resolved.num_epochs,
            resolved.attn_implementation) == (32, 4096, 5e-5, 5, "eager")  # 300 updates an epoch at 32
    assert (given.batch_size, given.max_tokens, given.learning_rate, given.num_epochs, given.attn_implementation) == \
        (0, 0, 0.0, 0, "auto")  # untouched
    assert "--learning-rate auto: 5e-05 (hidden size 768)" in caplog.text
    documents = resolve_auto(given, hidden_size=384, sentences_per_window=5.2,
                             updates_per_epoch=lambda b, t: 2400 // b, device_type="cpu")
    assert (documents.batch_size, documents.num_epochs) == (6, 4)  # 6 windows of ~5 sentences; 400 updates
    on_cpu = resolve_auto(TrainConfig(batch_size=8, learning_rate=3e-5, num_epochs=2), hidden_size=384,
                          sentences_per_window=5.0, updates_per_epoch=lambda b, t: 29, device_type="cpu")
    assert (on_cpu.batch_size, on_cpu.learning_rate, on_cpu.num_epochs, on_cpu.attn_implementation) == \
        (8, 3e-5, 2, "eager")
    assert resolve_auto(resolved, hidden_size=384, sentences_per_window=3.0, updates_per_epoch=lambda b, t: 1,
                        device_type="cuda") == resolved


@pytest.mark.parametrize("device_type, hidden_size, expected", [
    ("cpu", 384, (32, 4096, 2e-4)),  # today's measured CPU defaults, unchanged
    ("cpu", 768, (32, 4096, 5e-5)),
    ("mps", 384, (32, 4096, 2e-4)),  # a device type without its own budget gets the CPU's
    ("cuda", 384, (128, 16384, 4e-4)),  # 4x the micro-batch: sqrt(4) x the step
    ("cuda", 768, (128, 16384, 1e-4)),
])
def test_auto_micro_batch_and_learning_rate_follow_the_device(caplog, device_type, hidden_size, expected):
    from ner.training.auto import resolve_auto

    caplog.set_level("INFO", logger="ner")
    seen = []
    resolved = resolve_auto(TrainConfig(), hidden_size=hidden_size, sentences_per_window=1.0,
                            updates_per_epoch=lambda b, t: seen.append((b, t)) or 12800 // b, device_type=device_type)
    assert (resolved.batch_size, resolved.max_tokens, resolved.learning_rate) == expected
    assert seen[-1] == expected[:2]  # auto epochs count the updates of the micro-batch the run will use
    assert f"--max-tokens auto: {expected[1]} (on {device_type})" in caplog.text


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_a_given_micro_batch_is_kept_and_its_learning_rate_not_scaled(device_type):
    from ner.training.auto import resolve_auto

    counted = []

    def resolved(**given):
        return resolve_auto(TrainConfig(**given), hidden_size=384, sentences_per_window=1.0,
                            updates_per_epoch=lambda b, t: counted.append(t) or 100, device_type=device_type)

    assert resolved(max_tokens=8192).max_tokens == 8192
    assert counted[-1] == 8192  # and the auto epochs are counted with the budget given
    assert resolved(max_tokens=NO_TOKEN_BUDGET).max_tokens == NO_TOKEN_BUDGET  # fixed --batch-size
    assert counted[-1] == NO_TOKEN_BUDGET
    fixed = resolved(batch_size=32)
    assert (fixed.batch_size, fixed.learning_rate) == (32, 2e-4)  # the LR is scaled for the auto micro-batch only


def test_max_tokens_spells_auto_as_0_as_every_numeric_option_does(tmp_path, capsys):
    assert TrainConfig().max_tokens == 0  # auto
    assert parse_config([])[0].max_tokens == 0
    assert parse_config(["--max-tokens", str(NO_TOKEN_BUDGET)])[0].max_tokens == NO_TOKEN_BUDGET
    assert parse_config(["--max-tokens", "8192"])[0].max_tokens == 8192
    config = tmp_path / "c.yaml"
    config.write_text("max_tokens: 4096\n")
    assert parse_config(["--config", str(config)])[0].max_tokens == 4096
    assert parse_config(["--config", str(config), "--max-tokens", "0"])[0].max_tokens == 0
    for text in ("max_tokens: auto\n", "batch_size: auto\n"):  # no option spells auto as a word
        config.write_text(text)
        with pytest.raises(UserError, match=f"option '{text.split(':')[0]}' expects int, got 'auto'"):
            load_yaml(config)
    config.write_text("max_tokens:\n")  # null: an option with a number is never unset
    with pytest.raises(UserError, match="option 'max_tokens' expects int, got None"):
        load_yaml(config)
    with pytest.raises(SystemExit):
        parse_config(["--max-tokens", "auto"])
    assert "--max-tokens: invalid int value: 'auto'" in capsys.readouterr().err
    with pytest.raises(UserError, match=f"--max-tokens must be positive, 0 for auto or {NO_TOKEN_BUDGET} for a fixed "
                                        f"--batch-size \\(got {NO_TOKEN_BUDGET - 1}\\)"):
        parse_config(["--max-tokens", str(NO_TOKEN_BUDGET - 1)])


def test_the_resolved_token_budget_is_stored_with_the_run(tiny_bert, tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--max-tokens", "0", "--max-steps", "2",
                                    "--no-eval")) == 0
    assert "--max-tokens auto: 4096 (on cpu)" in capsys.readouterr().err
    assert json.loads((out / "final" / "training_args.json").read_text())["max_tokens"] == 4096
    assert read_state(list_checkpoints(out)[-1])["config"]["max_tokens"] == 4096


def test_auto_precision_is_stored_as_it_ran_and_a_resume_that_would_run_otherwise_is_refused(
        tiny_bert, tiny_data, tmp_path, monkeypatch, capsys):
    """--mixed-precision auto ran in bf16 (a CPU with bf16 units): the checkpoint, training_args.json and the model
    card say bf16, not auto. Resumed with auto where the CPU has none, auto means fp32: refused, naming the option,
    rather than training on in other math; the value that ran, passed explicitly, resumes."""
    import ner.backends

    out = tmp_path / "run"
    args = tiny_args(tiny_bert, tiny_data, out, "--max-steps", "2", "--no-eval", "--resume", "auto")
    monkeypatch.setattr(ner.backends, "cpu_supports_bf16", lambda: True)
    assert train_cli.main([*args, "--mixed-precision", "auto"]) == 0
    assert read_state(list_checkpoints(out)[-1])["config"]["mixed_precision"] == BF16
    assert json.loads((out / "final" / "training_args.json").read_text())["mixed_precision"] == BF16
    assert f"| mixed precision | `{BF16}` |" in (out / "final" / "README.md").read_text()
    monkeypatch.setattr(ner.backends, "cpu_supports_bf16", lambda: False)
    capsys.readouterr()
    assert train_cli.main([*args, "--max-steps", "3", "--mixed-precision", "auto"]) == 2
    err = capsys.readouterr().err
    assert f"mixed_precision: checkpoint {BF16!r}, now {NO_MIXED_PRECISION!r}" in err and "Traceback" not in err
    assert train_cli.main([*args, "--max-steps", "3", "--mixed-precision", BF16]) == 0
    assert read_state(list_checkpoints(out)[-1])["global_step"] == 3


def test_a_checkpoint_from_before_precision_was_stored_resolved_resumes_as_before(tmp_path):
    """Older checkpoints say `auto`, not what it resolved to: unknown, so any resolution matches it, as the check
    compared it before; one that says what ran is held to it."""
    from ner.training.checkpoint import check_compatible

    config = TrainConfig().to_dict()
    for now in (BF16, NO_MIXED_PRECISION):
        check_compatible({"config": config, "label_list": ["O"], "world_size": 1},
                         {**config, "mixed_precision": now}, ["O"], 1, tmp_path)
    saved = {"config": {**config, "mixed_precision": BF16}, "label_list": ["O"], "world_size": 1}
    with pytest.raises(UserError, match=f"mixed_precision: checkpoint {BF16!r}, now {NO_MIXED_PRECISION!r}"):
        check_compatible(saved, {**config, "mixed_precision": NO_MIXED_PRECISION}, ["O"], 1, tmp_path)


@pytest.mark.parametrize("stored", [0, None], ids=["fixed-batch-size-as-0", "auto-as-None"])
def test_a_checkpoint_of_the_old_max_tokens_spelling_is_refused_by_name(tiny_bert, tiny_data, tmp_path, capsys,
                                                                      stored):
    """Before --max-tokens spelled auto as 0, 0 was a fixed --batch-size (and None, unresolved, auto): such a
    checkpoint's resume names the difference, as any other must-match setting's (red with max_tokens MAY_CHANGE)."""
    from ner.files import file_entry, read_record, write_record
    from ner.training.checkpoint import CHECKPOINT_TOOL, MANIFEST, STATE

    run_args = tiny_args(tiny_bert, tiny_data, tmp_path / "run", "--max-steps", "1", "--no-eval")
    assert train_cli.main(run_args) == 0
    old = tmp_path / "old"
    shutil.copytree(list_checkpoints(tmp_path / "run")[-1], old)
    state = json.loads((old / STATE).read_text())
    state["config"]["max_tokens"] = stored
    (old / STATE).write_text(json.dumps(state))
    manifest = read_record(old, CHECKPOINT_TOOL, MANIFEST)  # sealed as such a checkpoint was
    write_record(old, CHECKPOINT_TOOL, {**manifest, STATE: file_entry(old / STATE)}, MANIFEST)
    capsys.readouterr()
    code = train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "out", "--max-steps", "2", "--no-eval",
                                    "--resume", str(old)))
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1].startswith(f"error: {old}: cannot resume: ")
    assert f"max_tokens: checkpoint {stored!r}, now {NO_TOKEN_BUDGET}" in err.strip().splitlines()[-1]
    assert "Traceback" not in err


def test_remote_code_is_off_unless_asked():
    assert TrainConfig().trust_remote_code is False
    assert parse_config(["--trust-remote-code"])[0].trust_remote_code is True


def test_every_field_declares_how_resume_treats_it():
    """A field added without saying whether a resume may change it, and what older checkpoints ran with, is the
    defect this prevents (one that broke every older checkpoint once): declare resume=MAY_CHANGE, MUST_MATCH or
    AddedLater(value the older checkpoints ran with) where the field is declared."""
    undeclared = [spec.name for spec in dataclasses.fields(TrainConfig) if resume_rule(spec) is None]
    assert undeclared == [], f"TrainConfig fields without a resume rule: {undeclared}"
    rules = {spec.name: resume_rule(spec) for spec in dataclasses.fields(TrainConfig)}
    assert rules["export_int8"] == MAY_CHANGE and rules["learning_rate"] == MUST_MATCH
    assert rules["decode"] == AddedLater("argmax")
