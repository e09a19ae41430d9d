"""Benchmarks of the `ner` package: one entry point per question. Run them from the root of a checkout
(they are not in the wheel; `python -m` finds this folder because the current directory is on the path):

    python -m benchmarks.training_speed --sentences 3000 --out bench_out/   # the canonical loop vs ours
    python -m benchmarks.baseline --train-file T --validation-file V --result R  # the canonical loop alone
    python -m benchmarks.eval_speed bench_out/runs/ours/final ../shared/data/conll2003/valid.txt  # evaluate/predict
    python -m benchmarks.inference runs/final_onnx ../shared/data/conll2003/valid.txt  # torch, onnx, onnx-int8
    python -m benchmarks.inference_phases runs/final_onnx ../shared/data/conll2003/train.txt  # where the time goes
    python -m benchmarks.shapes --multiples 1,4,8                           # cost of new batch shapes on CPU
    python -m benchmarks.seeds --seeds 1 2 3 --out seeds_out/x -- --config scripts/conll2003.yaml  # F1 over seeds
    python -m benchmarks.startup MODEL_DIR --runs 3                          # start-up and peak RSS per runtime
    python -m benchmarks.startup --train --runs 5                            # ner.train's fixed cost per phase
    python -m benchmarks.batch_independence MODEL_DIR ../shared/data/conll2003/train.txt  # fixed-shape plans
    python -m benchmarks.text_split --chars 100000                          # adversarial text vs prose
    python -m benchmarks.corpus_scaling MODEL_DIR ../shared/data/conll2003/train.txt --out scal/  # processes x threads
    python -m benchmarks.batch_plan_before_buckets --help                   # ner.train with the plan before buckets
    python -m benchmarks.batch_plans ../shared/data/conll2003/train.txt     # how far the two plans differ
    python -m benchmarks.fp32_tail --help                                   # ner.train, bf16 then fp32 at the end
    python -m benchmarks.confidence MODEL_DIR ../shared/data/conll2003/valid.txt --out conf/  # which confidence
    python -m benchmarks.active_learning --out al/ --seeds 1 2 3            # ner.select against random choice

Libraries (no entry point): `measure` (process time and memory, FLOPs, MFU, the matmul peak) and
`report` (bench.json / bench.md of training_speed). Results: docs/performance.md, docs/context.md,
docs/raw_text.md, docs/corpus.md, docs/accuracy.md, docs/active_learning.md.
"""
