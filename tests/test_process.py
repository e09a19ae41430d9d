"""An entry point's process (ner/process.py): its rank from the launcher's environment, and its fast exit."""

from __future__ import annotations

import pytest

from ner.process import process_rank_from_env


@pytest.mark.parametrize(("env", "rank", "world"), [
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, 3, (3, 1, 4)),  # a launcher's process
    ({}, 0, None),  # nothing launched it
])
def test_one_reading_of_the_rank_for_the_entry_points_and_the_raw_ddp_backend(monkeypatch, env, rank, world):
    from ner.backends.raw_ddp import _world

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (process_rank_from_env(), _world(None)) == (rank, world)
