"""The experiment trackers --report-to names: Accelerate's, checked without importing Accelerate."""

from __future__ import annotations

from ner.errors import UserError

# Accelerate's trackers (accelerate.tracking.LOGGER_TYPE_TO_CLASS; a test keeps the two equal).
TRACKERS = ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")


def report_trackers(report_to: str) -> list[str]:
    """--report-to as a list of tracker names: [] for none, ["all"] for all; anything else is an error."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    if names in ([], ["none"]):
        return []
    unknown = [name for name in names if name not in (*TRACKERS, "all")]
    if unknown or ("all" in names and len(names) > 1) or "none" in names:
        raise UserError(f"--report-to {report_to}: expected none, all, or trackers separated by commas "
                        f"from: {', '.join(TRACKERS)}")
    return list(dict.fromkeys(names))
