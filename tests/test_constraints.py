"""scripts/freeze_constraints.py: the environment the tests run in, as pins a user can install from."""

from __future__ import annotations

from scripts.freeze_constraints import main


def test_constraints_pin_this_environment_without_local_labels_or_the_project(tmp_path):
    out = tmp_path / "constraints.txt"
    assert main(["--out", str(out)]) == 0
    pins = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    names = {pin.split("==")[0].lower() for pin in pins}
    assert all("==" in pin and "+" not in pin for pin in pins)
    assert {"torch", "pytest", "transformers", "accelerate"} <= names and "ner" not in names


def test_a_file_it_did_not_write_is_refused_and_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "requirements.txt"
    out.write_text("numpy\n")
    assert main(["--out", str(out)]) == 2
    assert out.read_text() == "numpy\n" and "--overwrite" in capsys.readouterr().err
    assert main(["--out", str(out), "--overwrite"]) == 0 and main(["--out", str(out)]) == 0  # now it is ours
    assert out.read_text().startswith("# Versions with which the test suite passed")
