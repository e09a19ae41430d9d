"""Corpus tagging (ner/corpus/): chunks in input order, resume, refusal, 1 process = 2 gloo processes."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ONNX_PACKAGES, PEOPLE, PLACES, needs, python_module, run_cli, torch_threads

import ner.corpus.manifest
import ner.corpus.plan
import ner.corpus.tagging
from ner import files
from ner.backends import BF16, NO_MIXED_PRECISION
from ner.inference.options import INFERENCE_BUDGETS
from ner.inference.runtimes import ONNX, ONNX_INT8, TORCH
from ner.predict import build_parser, main

TEXTS = [f"{PEOPLE[i % len(PEOPLE)]} flew to {PLACES[i % len(PLACES)]} on day {i} ." for i in range(11)]
FAST = ["--mixed-precision", NO_MIXED_PRECISION, "--quiet", "--batch-size", "3"]


def tag(model: Path, out: Path, *inputs: object, extra: tuple[str, ...] = ()) -> int:
    return main([str(model), *map(str, inputs), "--output-dir", str(out), *FAST, *extra])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def folder_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


@pytest.fixture
def corpus(tmp_path) -> dict[str, Path]:
    """11 texts in two files (7 + 4, one empty line): chunks of 4 cut across the files."""
    first, second = tmp_path / "in" / "a.txt", tmp_path / "in" / "b.txt"
    first.parent.mkdir()
    first.write_text("\n".join(TEXTS[:6]) + "\n\n", encoding="utf-8")
    second.write_text("\n".join(TEXTS[6:10]), encoding="utf-8")  # no final newline
    return {"first": first, "second": second}


def test_chunks_hold_every_text_once_in_input_order(random_model, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"], corpus["second"], extra=("--chunk-texts", "4", "--merge")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "part-00000.jsonl", "part-00001.jsonl",
                                                      "part-00002.jsonl", "predictions.jsonl"]
    assert [len(lines(out / f"part-0000{k}.jsonl")) for k in range(3)] == [4, 4, 3]
    merged = lines(out / "predictions.jsonl")
    assert [r["_source"] for r in merged] == ([f"{corpus['first']}:{i}" for i in range(1, 8)]
                                               + [f"{corpus['second']}:{i}" for i in range(1, 5)])
    assert (out / "predictions.jsonl").read_bytes() == b"".join((out / f"part-0000{k}.jsonl").read_bytes()
                                                                 for k in range(3))
    # the same entities as the stdout mode gives for the whole input at once
    capsys.readouterr()
    main([str(random_model), str(corpus["first"]), *FAST])
    main([str(random_model), str(corpus["second"]), *FAST])
    alone = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["entities"] for r in merged] == [r["entities"] for r in alone]
    assert merged[6]["entities"] == []  # the empty line is a text too


def test_glob_and_folder_inputs_read_sorted_files_and_skip_hidden_ones(random_model, tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "b.txt").write_text(TEXTS[1] + "\n", encoding="utf-8")
    (folder / "a.txt").write_text(TEXTS[0] + "\n", encoding="utf-8")
    (folder / ".hidden.txt").write_text("not read\n", encoding="utf-8")
    assert tag(random_model, tmp_path / "by_folder", folder, extra=("--merge",)) == 0
    assert tag(random_model, tmp_path / "by_glob", f"{folder}/**/*.txt", extra=("--merge",)) == 0
    expected = [f"{folder / 'a.txt'}:1", f"{folder / 'sub' / 'b.txt'}:1"]
    assert [r["_source"] for r in lines(tmp_path / "by_folder" / "predictions.jsonl")] == expected
    assert [r["_source"] for r in lines(tmp_path / "by_glob" / "predictions.jsonl")] == expected


def test_jsonl_records_keep_their_other_fields(random_model, tmp_path):
    source = tmp_path / "docs.jsonl"
    records = [{"id": f"doc-{i}", "text": text, "meta": {"page": i}, "entities": [[0, 3, "PER"]]}
               for i, text in enumerate(TEXTS[:5])]
    source.write_text("\n".join(json.dumps(r) for r in records[:2]) + "\n\n"
                      + "\n".join(json.dumps(r) for r in records[2:]) + "\n", encoding="utf-8")
    assert tag(random_model, tmp_path / "json", source, extra=("--jsonl", "--chunk-texts", "2", "--merge")) == 0
    assert tag(random_model, tmp_path / "spans", source,
               extra=("--jsonl", "--format", "spans", "--chunk-texts", "2", "--merge")) == 0
    as_json = lines(tmp_path / "json" / "predictions.jsonl")
    as_spans = lines(tmp_path / "spans" / "predictions.jsonl")
    assert [r["_source"] for r in as_json] == [f"{source}:{n}" for n in (1, 2, 4, 5, 6)]  # blank line 3 skipped
    for record, out_json, out_spans in zip(records, as_json, as_spans):
        assert (out_json["id"], out_json["text"], out_json["meta"]) == (record["id"], record["text"], record["meta"])
        assert (out_spans["id"], out_spans["meta"]) == (record["id"], record["meta"])
        assert out_spans["entities"] == [[e["start"], e["end"], e["type"]] for e in out_json["entities"]]


def test_a_bad_line_names_its_file_and_line_and_writes_nothing_for_its_chunk(random_model, tmp_path, capsys):
    source = tmp_path / "docs.jsonl"
    rows = [json.dumps({"text": text}) for text in TEXTS[:9]]
    rows[5] = '{"text": "cut off'
    source.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert tag(random_model, out, source, extra=("--jsonl", "--chunk-texts", "3")) == 2
    assert f"{source}:6: not valid JSON" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "part-00000.jsonl"]


def test_parquet_and_datasets_rows_carry_their_row(random_model, tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": TEXTS[:3], "n": [1, 2, 3]}), tmp_path / "t.parquet")
    datasets.Dataset.from_dict({"body": TEXTS[3:5]}).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "out"
    assert tag(random_model, out, tmp_path / "t.parquet", tmp_path / "ds",
               extra=("--text-column", "body", "--merge")) == 0
    assert [r["_source"] for r in lines(out / "predictions.jsonl")] == [
        f"{tmp_path / 't.parquet'}#{i}" for i in range(3)] + [f"{tmp_path / 'ds'}#{i}" for i in range(2)]


def test_rerun_after_a_kill_between_chunks_rewrites_only_the_missing_part(random_model, corpus, tmp_path):
    out = tmp_path / "out"
    args = (corpus["first"], corpus["second"])
    assert tag(random_model, out, *args, extra=("--chunk-texts", "4", "--merge")) == 0
    reference = folder_bytes(out)
    kept = {name: (out / name).stat().st_mtime_ns for name in ("part-00000.jsonl", "part-00002.jsonl")}
    (out / "part-00001.jsonl").unlink()
    (out / "predictions.jsonl").unlink()
    assert tag(random_model, out, *args, extra=("--chunk-texts", "4", "--merge")) == 0
    assert folder_bytes(out) == reference
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept  # skipped, not rewritten


@pytest.mark.slow
def test_kill_inside_a_chunk_then_resume_is_byte_identical(random_model, corpus, tmp_path):
    command = python_module("ner.predict", str(random_model), str(corpus["first"]), str(corpus["second"]),
                            "--output-dir", str(tmp_path / "out"), "--chunk-texts", "4", "--merge", *FAST)
    killed = run_cli(command, env={"NER_FAULT_INJECT": "kill:1"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "part-00000.jsonl"]
    stale = out / ".part-00001.jsonl.tmp-0123abcd.jsonl"  # what a kill during the write would leave
    stale.write_text('{"_source": "half', encoding="utf-8")
    (out / "notes.txt").write_text("the user's", encoding="utf-8")
    finished = (out / "part-00000.jsonl").stat().st_mtime_ns
    with torch_threads(1):  # the killed run's count (run_cli sets OMP_NUM_THREADS=1); another is refused
        assert main(command[3:]) == 0  # the same arguments, in this process
        assert tag(random_model, tmp_path / "ref", corpus["first"], corpus["second"],
                   extra=("--chunk-texts", "4", "--merge")) == 0
    assert (out / "part-00000.jsonl").stat().st_mtime_ns == finished  # skipped
    assert not stale.exists()
    assert (out / "notes.txt").read_text(encoding="utf-8") == "the user's"
    assert folder_bytes(tmp_path / "ref") == {k: v for k, v in folder_bytes(out).items() if k != "notes.txt"}


def test_a_changed_input_or_setting_is_refused_with_the_difference_named(random_model, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4")) == 0
    before = folder_bytes(out)
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "5")) == 2
    assert "--chunk-texts: 4 before, 5 now" in capsys.readouterr().err
    with open(corpus["first"], "a", encoding="utf-8") as handle:
        handle.write("one more text\n")
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4")) == 2
    assert f"input {corpus['first'].resolve()} changed" in capsys.readouterr().err
    assert folder_bytes(out) == before
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4", "--overwrite")) == 0
    assert len(lines(out / "part-00001.jsonl")) == 4  # 8 texts now


def test_a_folder_that_is_not_ours_is_refused_and_overwrite_removes_only_ours(random_model, corpus, tmp_path,
                                                                               capsys):
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "results.jsonl").write_text("keep me\n", encoding="utf-8")
    assert tag(random_model, foreign, corpus["first"], extra=("--overwrite",)) == 2
    assert f"{foreign / 'results.jsonl'}: --output-dir {foreign} is not empty" in capsys.readouterr().err
    assert [p.name for p in foreign.iterdir()] == ["results.jsonl"]

    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "2", "--merge")) == 0
    (out / "part-00009.txt").write_text("the user's\n", encoding="utf-8")
    assert tag(random_model, out, corpus["second"], extra=("--chunk-texts", "4", "--overwrite")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "part-00000.jsonl", "part-00009.txt"]


def test_progress_counts_texts_over_the_total(random_model, corpus, tmp_path, capsys):
    main([str(random_model), str(corpus["first"]), "--output-dir", str(tmp_path / "out"), "--chunk-texts", "4",
          "--mixed-precision", NO_MIXED_PRECISION])
    err = capsys.readouterr().err
    assert "corpus: 7 texts in 2 chunks of 4, 0 done already; 1 process(es)" in err
    assert "corpus: 4/7 texts (57.1%)" in err and "corpus: 7/7 texts (100.0%)" in err
    assert "texts/s over 1 process, ETA" in err


def torchrun(*args: str, max_restarts: int = 0) -> list[str]:
    return python_module("torch.distributed.run", "--standalone", "--nproc_per_node=2",
                         f"--max-restarts={max_restarts}", "-m", "ner.predict", *args)


@pytest.mark.slow
def test_two_gloo_processes_write_the_same_bytes_as_one(random_model, corpus, tmp_path):
    args = [str(random_model), str(corpus["first"]), str(corpus["second"]), "--chunk-texts", "3", "--merge", *FAST]
    one = run_cli(python_module("ner.predict", *args, "--output-dir", str(tmp_path / "one")))
    assert one.returncode == 0, one.stderr[-2000:]
    two = run_cli(torchrun(*args, "--output-dir", str(tmp_path / "two")))
    assert two.returncode == 0, two.stderr[-3000:]
    assert len(folder_bytes(tmp_path / "one")) == 5  # 4 parts, dealt 0,2 / 1,3, and the merged file
    assert folder_bytes(tmp_path / "two") == folder_bytes(tmp_path / "one")


@pytest.mark.slow
def test_torchrun_restarts_a_killed_process_and_the_run_completes(random_model, corpus, tmp_path):
    args = [str(random_model), str(corpus["first"]), str(corpus["second"]), "--chunk-texts", "2", "--merge", *FAST]
    one = run_cli(python_module("ner.predict", *args, "--output-dir", str(tmp_path / "one")))
    assert one.returncode == 0, one.stderr[-2000:]
    job = run_cli(torchrun(*args, "--output-dir", str(tmp_path / "two"), max_restarts=1),
                  env={"NER_FAULT_INJECT": "kill:3:1"})
    assert job.returncode == 0, job.stderr[-3000:]
    assert "NER_FAULT_INJECT: kill at step 3 on rank 1" in job.stderr
    assert folder_bytes(tmp_path / "two") == folder_bytes(tmp_path / "one")


RANK_1_FAILS = """import os, sys
import ner.corpus.tagging
from ner.predict import main
real = ner.corpus.tagging.expand_inputs
def listing(*args):
    if os.environ["RANK"] == "1":
        raise FileNotFoundError(2, "No such file or directory", "corpus/b.txt")
    return real(*args)
ner.corpus.tagging.expand_inputs = listing
sys.exit(main())
"""


@pytest.mark.slow
def test_torchrun_prints_one_ranks_error_once_and_every_process_exits(random_model, corpus, tmp_path):
    """Real gloo processes: rank 1 fails while listing its inputs; rank 0 prints the line before anyone exits
    (torchrun stops the others when one exits: before, rank 0 could be stopped before it had printed)."""
    script = tmp_path / "rank_1_fails.py"
    script.write_text(RANK_1_FAILS, encoding="utf-8")
    job = run_cli(python_module("torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
                                str(random_model), str(corpus["first"]), "--output-dir", str(tmp_path / "out"),
                                "--dist-timeout", "60", *FAST), timeout=240)
    assert job.returncode != 0
    assert [line for line in job.stderr.splitlines() if line.startswith("error:")] == [
        "error: process 1 of 2: FileNotFoundError: [Errno 2] No such file or directory: 'corpus/b.txt'"]
    assert not (tmp_path / "out").exists()


TAG_THEN_SAY_IF_TORCH = """import json, sys
from ner.predict import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch_imported": "torch" in sys.modules}))
"""


def test_onnx_corpus_tagging_in_one_process_needs_no_torch(random_model, corpus, tmp_path):
    """`--output-dir --runtime onnx` without a launcher: torch unimportable, the same parts as with it importable,
    and torch never imported where it could be (the backend seam's single process needs none of it)."""
    pytest.importorskip("onnxruntime")
    from ner.inference.onnx_export import write_onnx
    from tests.test_onnx import NO_TORCH, run_without_torch

    model = tmp_path / "model"
    shutil.copytree(random_model, model)
    write_onnx(model)
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    args = [str(model), str(corpus["first"]), str(corpus["second"]), "--runtime", ONNX, "--chunk-texts", "4",
            "--merge", "--quiet"]
    run_without_torch(python_module("ner.predict", *args, "--output-dir", str(tmp_path / "blocked")), True, tmp_path)
    said = run_without_torch([sys.executable, "-c", TAG_THEN_SAY_IF_TORCH, *args, "--output-dir",
                              str(tmp_path / "importable")], False, tmp_path)
    assert json.loads(said) == {"code": 0, "torch_imported": False}
    assert folder_bytes(tmp_path / "blocked") == folder_bytes(tmp_path / "importable")
    assert len(lines(tmp_path / "blocked" / "predictions.jsonl")) == 11


def test_without_output_dir_several_inputs_are_refused(random_model, corpus, capsys):
    assert main([str(random_model), str(corpus["first"]), str(corpus["second"])]) == 2
    assert "several INPUTs need --output-dir" in capsys.readouterr().err


def test_auto_chunks_come_from_the_corpus_size_alone_and_balance_two_processes():
    """--chunk-texts 0 (auto): 12,000 texts were 3 chunks of 4096, dealt 7,904 : 4,096 to two processes
    (docs/corpus.md)."""
    sizes = {texts: ner.corpus.plan.chunk_texts_for(0, texts) for texts in (7, 12_000, 40_000, 100_000, 10_000_000)}
    assert sizes == {7: 2048, 12_000: 2048, 40_000: 2500, 100_000: 4096, 10_000_000: 4096}
    for texts in (12_000, 40_000, 100_000):
        plan = ner.corpus.plan.Plan(texts, sizes[texts], frozenset())
        dealt = [sum(plan.size(k) for k in plan.mine(rank, 2)) for rank in (0, 1)]
        assert sum(dealt) == texts and min(dealt) / max(dealt) > 0.9
    assert ner.corpus.plan.chunk_texts_for(4, 12_000) == 4  # a number given is kept
    assert build_parser().parse_args(["m", "x.txt", "--output-dir", "o"]).chunk_texts == 0  # auto, as every 0
    with pytest.raises(SystemExit):  # no numeric option spells auto as a word
        build_parser().parse_args(["m", "x.txt", "--output-dir", "o", "--chunk-texts", "auto"])


def test_a_negative_chunk_size_is_refused(random_model, corpus, tmp_path, capsys):
    assert tag(random_model, tmp_path / "out", corpus["first"], extra=("--chunk-texts", "-1")) == 2
    assert "--chunk-texts must be positive, or 0 for auto (got -1)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_manifest_records_model_settings_computation_and_input(random_model, corpus, tmp_path):
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "model.safetensors" in manifest["model"]["sha256"]
    assert manifest["settings"]["chunk_texts"] == 0 and manifest["texts"] == 7 and manifest["chunk_texts"] == 2048
    # how the numbers were computed, as the loaded Tagger does it; the batch budget as resolved for the device
    # (the CPU's tokens here; windows as given), so a resume on a GPU is refused, not mixed
    assert manifest["computation"] == {
        "runtime": TORCH, "precision": "no", "device": "cpu", "threads": 1, "casing": "none",
        "context": "none", "decode": "viterbi", "max_seq_length": 128, "min_score": None, "batch_size": 3,
        "max_tokens": INFERENCE_BUDGETS["cpu"][1]}
    assert manifest["inputs"][0]["files"][0]["size"] == corpus["first"].stat().st_size
    shutil.rmtree(out)


def test_a_resume_on_another_thread_count_writes_the_same_bytes(random_model, corpus, tmp_path, capsys):
    """torch runs each CPU pass on one thread (inference/torch_runtime.py), so the process's threads are free."""
    out, inputs, extra = tmp_path / "out", (corpus["first"], corpus["second"]), ("--chunk-texts", "4", "--merge")
    with torch_threads(1):
        assert tag(random_model, out, *inputs, extra=extra) == 0
    reference = folder_bytes(out)
    (out / "part-00001.jsonl").unlink()
    (out / "predictions.jsonl").unlink()
    with torch_threads(2):
        assert main([str(random_model), *map(str, inputs), "--output-dir", str(out),
                     "--mixed-precision", NO_MIXED_PRECISION, "--batch-size", "3", "--dist-timeout", "60", *extra]) == 0
    assert folder_bytes(out) == reference


def test_a_resume_computed_on_other_operator_threads_is_refused(random_model, corpus, tmp_path, capsys):
    """An ONNX session's operators are threaded: N threads may sum in another order than M."""
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["computation"]["threads"] = 3
    (out / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert tag(random_model, out, corpus["first"]) == 2
    err = capsys.readouterr().err
    assert "threads: 3 before, 1 now" in err and "OMP_NUM_THREADS=3" in err and "--overwrite" in err


@pytest.mark.parametrize(("first", "then", "named", "fix"), [
    (("--decode", "argmax"), ("--decode", "viterbi"), "decode: 'argmax' before, 'viterbi' now", "--decode argmax"),
    ((), ("--mixed-precision", BF16), "precision: 'no' before, 'bf16' now", "--mixed-precision no"),
    ((), ("--max-seq-length", "64"), "max_seq_length: 128 before, 64 now", "--max-seq-length 128"),
    ((), ("--batch-size", "2"), "batch_size: 3 before, 2 now", "--batch-size 3"),
])
def test_a_resume_that_would_compute_otherwise_is_refused_naming_the_setting(random_model, corpus, tmp_path, capsys,
                                                                            first, then, named, fix):
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4", *first)) == 0
    before = folder_bytes(out)
    capsys.readouterr()
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4", *then)) == 2
    err = capsys.readouterr().err
    assert named in err and f"({fix})" in err and "--overwrite" in err
    assert folder_bytes(out) == before


def test_a_manifest_of_another_runtime_or_device_is_refused_naming_them(random_model, corpus, tmp_path, capsys):
    """As an ONNX run on a GPU would have written it (neither is available to the test)."""
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["computation"].update(runtime=ONNX, device="gpu", threads=None)
    (out / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert tag(random_model, out, corpus["first"], extra=("--runtime", TORCH)) == 2  # an explicit change
    err = capsys.readouterr().err
    assert f"runtime: {ONNX!r} before, {TORCH!r} now" in err and "device: 'gpu' before, 'cpu' now" in err
    assert "threads: None before" in err and f"(--runtime {ONNX}, a gpu device)" in err


@needs(*ONNX_PACKAGES)
def test_an_auto_resume_keeps_the_runtime_its_parts_were_tagged_with(random_model, corpus, tmp_path, monkeypatch):
    """A further export between the runs would make auto pick another runtime (here: a model.onnx on a CPU whose
    order puts it before torch); the resume keeps the recorded one and writes the same bytes. The file's contents
    are no model: loading it would fail."""
    from ner.inference import runtime_choice
    from ner.inference.runtimes import RUNTIME_FILES

    model, out, extra = tmp_path / "model", tmp_path / "out", ("--chunk-texts", "4", "--merge")
    shutil.copytree(random_model, model)
    monkeypatch.setattr(runtime_choice, "this_cpu_class", lambda: "avx2")
    assert tag(model, out, corpus["first"], corpus["second"], extra=extra) == 0
    reference = folder_bytes(out)
    assert json.loads((out / "manifest.json").read_text())["computation"]["runtime"] == TORCH
    (out / "part-00001.jsonl").unlink()
    (model / RUNTIME_FILES[ONNX][0]).write_bytes(b"a further export")
    assert runtime_choice.choose("avx2", model).runtime != TORCH
    assert tag(model, out, corpus["first"], corpus["second"], extra=extra) == 0
    assert folder_bytes(out) == reference


def test_an_auto_resume_whose_runtime_cannot_run_any_more_is_refused(random_model, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["computation"]["runtime"] = ONNX_INT8  # as auto would have recorded it, the files since removed
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = folder_bytes(out)
    capsys.readouterr()
    assert tag(random_model, out, corpus["first"]) == 2
    err = capsys.readouterr().err
    assert f"{out}: its parts were tagged with --runtime {ONNX_INT8} (what auto chose then), which cannot run here " \
           "now (" in err and "--overwrite" in err
    assert folder_bytes(out) == before


@pytest.mark.parametrize("version", [1, 2])
def test_a_manifest_of_an_earlier_version_is_refused(random_model, corpus, tmp_path, capsys, version):
    """Version 1 did not record threads, device or the precision used: its parts cannot be shown to match. Version 2
    spelled auto --chunk-texts as a word, which no flag now takes."""
    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["computation"]
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": version}))
    capsys.readouterr()
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4")) == 2
    err = capsys.readouterr().err
    assert f"{out / 'manifest.json'}: manifest version {version}, this ner.predict writes version 3" in err
    assert "--overwrite" in err
    assert tag(random_model, out, corpus["first"], extra=("--chunk-texts", "4", "--overwrite")) == 0


RANK = threading.local()  # which fake rank this thread is


class FakeRank:
    """One of two ranks run as threads of this process: gather_object meets the other rank at a barrier, as
    all_gather_object does, so a rank that never comes leaves the other waiting (BrokenBarrierError here,
    after `timeout_s`, where a real process would wait for --dist-timeout). `events` records, in order, each
    rank's report of an error and its end."""

    num_processes = 2

    def __init__(self, rank: int, slots: list, barrier: threading.Barrier, events: list) -> None:
        import torch

        self.process_index, self.is_main_process, self.device = rank, rank == 0, torch.device("cpu")
        self.slots, self.barrier, self.events = slots, barrier, events

    def gather_object(self, obj: object) -> list:
        self.slots[self.process_index] = obj
        self.barrier.wait()
        gathered = list(self.slots)
        self.barrier.wait()
        return gathered

    def wait_for_everyone(self) -> None:
        self.barrier.wait()

    def end(self) -> None:
        self.events.append(("end", self.process_index))


def two_ranks(monkeypatch, argv: list[str], timeout_s: float = 30) -> tuple[list[object], list[tuple]]:
    """tag_corpus as ranks 0 and 1 (threads): each rank's exit code (or exception), and the events."""
    slots, barrier, outcomes, events = [None, None], threading.Barrier(2, timeout=timeout_s), [None, None], []
    monkeypatch.setattr(ner.corpus.tagging, "inference_backend", lambda timeout_s: RANK.backend)
    real_report = ner.corpus.tagging.report

    def slow_report(exc: Exception, rank: int) -> int:
        time.sleep(0.3 if rank == 0 else 0)  # a slow printer: the other rank must not end before it has printed
        events.append(("report", rank, str(exc)))
        return real_report(exc, rank)

    monkeypatch.setattr(ner.corpus.tagging, "report", slow_report)

    def rank_main(rank: int) -> None:
        RANK.backend = FakeRank(rank, slots, barrier, events)
        try:
            outcomes[rank] = ner.corpus.tagging.tag_corpus(build_parser().parse_args(argv))
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcomes[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * timeout_s)
    return outcomes, events


def reached_every_rank(outcomes: list[object], events: list[tuple], capsys) -> str:
    """The one error every rank reported (exit code 2 each), printed once, by rank 0, before any rank ended."""
    assert outcomes == [2, 2]
    reported = {event[1]: event[2] for event in events if event[0] == "report"}
    assert sorted(reported) == [0, 1] and reported[0] == reported[1]
    first_end = min(i for i, event in enumerate(events) if event[0] == "end")
    assert events.index(("report", 0, reported[0])) < first_end
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")] == [
        f"error: {reported[0]}"]
    return reported[0]


def fails_on(rank: int, function, exc: Exception):
    """`function`, except that it raises `exc` on fake rank `rank`."""
    def wrapped(*args, **kwargs):
        if RANK.backend.process_index == rank:
            raise exc
        return function(*args, **kwargs)
    return wrapped


def corpus_argv(model: Path, corpus: dict[str, Path], out: Path) -> list[str]:
    return [str(model), str(corpus["first"]), str(corpus["second"]), "--output-dir", str(out), "--chunk-texts", "4",
            "--merge", *FAST]


def test_two_fake_ranks_write_the_same_bytes_as_one_process(random_model, corpus, tmp_path, monkeypatch):
    assert main(corpus_argv(random_model, corpus, tmp_path / "one")) == 0
    assert two_ranks(monkeypatch, corpus_argv(random_model, corpus, tmp_path / "two"))[0] == [0, 0]
    assert folder_bytes(tmp_path / "two") == folder_bytes(tmp_path / "one")


def test_an_unexpected_error_listing_inputs_on_one_rank_reaches_every_rank(random_model, corpus, tmp_path,
                                                                           monkeypatch, capsys):
    gone = FileNotFoundError(2, "No such file or directory", "in/b.txt")
    monkeypatch.setattr(ner.corpus.tagging, "expand_inputs", fails_on(1, ner.corpus.tagging.expand_inputs, gone))
    outcomes, events = two_ranks(monkeypatch, corpus_argv(random_model, corpus, tmp_path / "out"))
    assert reached_every_rank(outcomes, events, capsys) == (
        "process 1 of 2: FileNotFoundError: [Errno 2] No such file or directory: 'in/b.txt'")
    assert not (tmp_path / "out").exists()  # rank 0 did not go on to write a manifest


def test_an_error_in_rank_0s_folder_check_reaches_every_rank(random_model, corpus, tmp_path, monkeypatch, capsys):
    denied = PermissionError(13, "Permission denied", "w.bin")
    monkeypatch.setattr(ner.corpus.manifest, "model_identity", fails_on(0, ner.corpus.manifest.model_identity, denied))
    outcomes, events = two_ranks(monkeypatch, corpus_argv(random_model, corpus, tmp_path / "out"))
    assert reached_every_rank(outcomes, events, capsys) == (
        "process 0 of 2: PermissionError: [Errno 13] Permission denied: 'w.bin'")


def test_an_error_while_tagging_on_one_rank_reaches_every_rank_after_the_others_finish(random_model, corpus,
                                                                                        tmp_path, monkeypatch,
                                                                                        capsys):
    oom = RuntimeError("out of memory")
    monkeypatch.setattr(ner.corpus.tagging, "tag_chunk", fails_on(1, ner.corpus.tagging.tag_chunk, oom))
    outcomes, events = two_ranks(monkeypatch, corpus_argv(random_model, corpus, tmp_path / "out"))
    assert reached_every_rank(outcomes, events, capsys) == "process 1 of 2: RuntimeError: out of memory"
    # rank 0's chunks (0 and 2 of 3) are written, kept for the rerun; rank 1's is not; nothing merged
    assert sorted(folder_bytes(tmp_path / "out")) == ["part-00000.jsonl", "part-00002.jsonl"]


def test_an_error_merging_on_rank_0_reaches_every_rank(random_model, corpus, tmp_path, monkeypatch, capsys):
    full = OSError(28, "No space left")
    monkeypatch.setattr(ner.corpus.tagging, "merge_parts", fails_on(0, ner.corpus.tagging.merge_parts, full))
    outcomes, events = two_ranks(monkeypatch, corpus_argv(random_model, corpus, tmp_path / "out"))
    assert reached_every_rank(outcomes, events, capsys) == "process 0 of 2: OSError: [Errno 28] No space left"


def test_ranks_that_would_compute_differently_are_refused_naming_the_setting(random_model, corpus, tmp_path,
                                                                            monkeypatch, capsys):
    monkeypatch.setattr(ner.corpus.manifest, "intra_op_threads", lambda runtime: 1 + RANK.backend.process_index)
    outcomes, events = two_ranks(monkeypatch, corpus_argv(random_model, corpus, tmp_path / "out"))
    error = reached_every_rank(outcomes, events, capsys)
    assert "threads: 1 in process 0, 2 in process 1" in error and "OMP_NUM_THREADS" in error
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ray_data_map_batches_gives_the_single_process_entities(random_model, corpus, tmp_path):
    """Ray started for real on this machine (a one-node cluster on loopback), CPU only."""
    ray = pytest.importorskip("ray")
    from ner.corpus import RayTagger

    out = tmp_path / "out"
    assert tag(random_model, out, corpus["first"], corpus["second"], extra=("--chunk-texts", "4", "--merge")) == 0
    expected = [json.dumps(r["entities"], ensure_ascii=False) for r in lines(out / "predictions.jsonl")]
    texts = TEXTS[:6] + [""] + TEXTS[6:10]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        dataset = ray.data.from_items([{"text": text, "n": i} for i, text in enumerate(texts)])
        tagged = dataset.map_batches(RayTagger, batch_size=4, concurrency=1, fn_constructor_kwargs={
            "model_dir": str(random_model), "precision": "no", "batch_size": 3})
        rows = tagged.take_all()
    finally:
        ray.shutdown()
    assert [row["n"] for row in rows] == list(range(len(texts)))  # the other columns come through
    assert [row["entities"] for row in rows] == expected


def test_ray_tagger_refuses_a_missing_text_with_its_row(random_model):
    """Ray Data hands a batch as columns; None there was tagged as the text "None"."""
    import numpy as np

    from ner.corpus import RayTagger
    from ner.errors import UserError

    tagger = RayTagger(str(random_model), precision=NO_MIXED_PRECISION)
    tagged = tagger({"text": np.array(["Ada Lovelace", "Paris"], dtype=object)})
    assert len(tagged["entities"]) == 2
    with pytest.raises(UserError, match=r"text row 1 of this batch: the text column holds NoneType, not a string"):
        tagger({"text": np.array(["Ada Lovelace", None], dtype=object)})


@pytest.mark.parametrize("spelling", ["relative", "dot-dot", "link", "glob"])
def test_output_inside_its_input_folder_is_never_read_as_input(random_model, corpus, tmp_path, monkeypatch,
                                                              spelling, capsys):
    """`ner.predict MODEL corpus/ --output-dir corpus/tagged`: a rerun, with --overwrite too, reads the same
    two files whatever the spelling of the input and OUT (the parts once came back as input)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "in")
    given = {"relative": "in", "dot-dot": "in/../in", "link": "link", "glob": "in/**/*"}[spelling]
    out = Path("in/tagged") if spelling != "link" else Path("link/tagged")
    assert tag(random_model, out, given, extra=("--merge",)) == 0
    first = lines(out / "predictions.jsonl")
    assert len(first) == 11
    assert tag(random_model, out, given, extra=("--merge",)) == 0  # a rerun: nothing added, nothing to do
    assert tag(random_model, out, given, extra=("--merge", "--overwrite")) == 0
    assert lines(out / "predictions.jsonl") == first
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(Path(f["path"]).name for s in manifest["inputs"] for f in s["files"]) == ["a.txt", "b.txt"]


def test_an_input_file_inside_the_output_folder_is_refused(random_model, corpus, tmp_path, capsys):
    out = tmp_path / "in" / "tagged"
    assert tag(random_model, out, corpus["first"]) == 0
    capsys.readouterr()
    assert tag(random_model, out, out / "part-00000.jsonl", extra=("--jsonl",)) == 2
    assert "inside --output-dir" in capsys.readouterr().err


@pytest.mark.parametrize("edited", ["part-00001.jsonl", "predictions.jsonl"])
@pytest.mark.parametrize("rerun", ["--overwrite", "--merge"])
def test_a_part_or_merged_file_you_edited_is_yours_overwrite_and_merge_refuse_to_touch_it(
        random_model, corpus, tmp_path, capsys, edited, rerun):
    """Each part is pinned (size, sha256) once complete, the merged file once written: an edited one is the user's.
    Red before: the manifest recorded them unpinned ({}), so --overwrite removed it and --merge replaced it."""
    out = tmp_path / "out"
    args = (corpus["first"], corpus["second"])
    assert tag(random_model, out, *args, extra=("--chunk-texts", "4", "--merge")) == 0
    entries = json.loads((out / "manifest.json").read_text())["files"]
    assert all(entries[name] == files.file_entry(out / name) for name in entries)  # all of them pinned
    with open(out / edited, "a", encoding="utf-8") as handle:
        handle.write('{"mine": true}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert tag(random_model, out, *args, extra=("--chunk-texts", "4", rerun)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {out / edited}: changed since ner.predict wrote it"), err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / edited).rename(tmp_path / edited)  # moved away: the rerun tags (or merges) it again
    assert tag(random_model, out, *args, extra=("--chunk-texts", "4", "--merge")) == 0
    assert (out / edited).read_bytes() != (tmp_path / edited).read_bytes()
    assert tag(random_model, out, *args, extra=("--chunk-texts", "4", "--overwrite")) == 0
