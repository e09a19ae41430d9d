"""Corpus tagging's errors (ner/corpus/tagging.py, all_or_none): a UserError is one line; anything else (a bug, an
out-of-memory) still reaches every process as one line, but the process that met it logs its traceback first.
tests/test_corpus.py checks that every kind reaches every process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import test_corpus
from conftest import run_cli
from test_corpus import corpus_argv, fails_on, two_ranks

import ner.corpus.tagging
from ner.errors import UserError
from ner.predict import main

corpus = test_corpus.corpus  # the fixture: 11 texts in two files, chunks of 4 cut across them


def failing_chunk(exc: Exception):
    """tag_chunk that raises `exc` on the second chunk, after the first was written."""
    real, seen = ner.corpus.tagging.tag_chunk, []

    def tag_chunk(*args, **kwargs):
        seen.append(1)
        if len(seen) == 2:
            raise exc
        return real(*args, **kwargs)

    return tag_chunk


# A real process, so stderr is what a user sees (no test harness holding log records): a KeyError in the second
# chunk, as a bug would raise it.
BUG_IN_A_CHUNK = """
import sys
import ner.corpus.tagging
from test_corpus_errors import failing_chunk
ner.corpus.tagging.tag_chunk = failing_chunk(KeyError("B-MISC"))
from ner.predict import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_bug_while_tagging_prints_its_traceback_then_the_one_line(random_model, corpus, tmp_path):
    argv = [a for a in corpus_argv(random_model, corpus, tmp_path / "out") if a != "--merge"]
    job = run_cli([sys.executable, "-c", BUG_IN_A_CHUNK, *argv], env={"PYTHONPATH": str(Path(__file__).parent)})
    assert job.returncode == 2, job.stderr[-3000:]
    assert "Traceback (most recent call last)" in job.stderr and "raise exc" in job.stderr
    assert job.stderr.strip().splitlines()[-1] == "error: KeyError: 'B-MISC'"
    # the chunk that failed left nothing, not even a temporary file; the one before it is whole
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json", "part-00000.jsonl"]
    assert len((tmp_path / "out" / "part-00000.jsonl").read_text().splitlines()) == 4


def test_a_user_error_while_tagging_stays_one_line_without_a_traceback(random_model, corpus, tmp_path,
                                                                       monkeypatch, capsys, caplog):
    monkeypatch.setattr(ner.corpus.tagging, "tag_chunk", failing_chunk(UserError("in/b.txt:3: not valid JSON")))
    argv = [a for a in corpus_argv(random_model, corpus, tmp_path / "out") if a != "--merge"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: in/b.txt:3: not valid JSON"]
    assert [r for r in caplog.records if r.exc_info] == []


@pytest.mark.parametrize("rank", [0, 1])
def test_a_bug_on_one_rank_is_logged_with_its_traceback_and_reaches_every_rank(random_model, corpus, tmp_path,
                                                                               monkeypatch, capsys, caplog, rank):
    oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(ner.corpus.tagging, "tag_chunk", fails_on(rank, ner.corpus.tagging.tag_chunk, oom))
    outcomes, _ = two_ranks(monkeypatch, corpus_argv(random_model, corpus, tmp_path / "out"))
    assert outcomes == [2, 2]  # both left: the other rank did not wait for one that had stopped
    line = f"process {rank} of 2: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    logged = [r for r in caplog.records if r.exc_info]  # only the rank that met it has a traceback to show
    assert [(r.levelname, r.exc_info[1], r.getMessage().startswith(line)) for r in logged] == [("ERROR", oom, True)]
    assert [text for text in capsys.readouterr().err.splitlines() if text.startswith("error:")] == [f"error: {line}"]
