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
