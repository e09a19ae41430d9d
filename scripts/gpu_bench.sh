#!/usr/bin/env bash
# bash scripts/gpu_bench.sh OUT      # on a CUDA machine with the project installed; about 8 minutes on one H200
# SMOKE=1 bash scripts/gpu_bench.sh OUT   # the same steps on a sliver of the data (checks the script on a CPU)
#
# Every GPU figure in docs/performance.md ("On a GPU") comes from this script, in this order:
#   1. the GPU-marked tests and scripts/gpu_check.sh (every backend, fp32 / bf16 / fp16, agreeing);
#   2. the same 12 fp32 steps on the CPU, compared with each GPU backend's weights;
#   3. benchmarks.training_speed on the full CoNLL-2003 train set: baseline loop vs ours, tokens/s, MFU;
#   4. the CoNLL-2003 recipe (scripts/conll2003.yaml) with the defaults, seed 1: test F1, wall time;
#   5. inference batch budgets (benchmarks.batch_independence: throughput, lone-text latency, answers alone
#      vs batched), then corpus tagging of 100,000 texts at the GPU's and the CPU's budget, and with ONNX;
#   6. ner.serve under 1 and 64 concurrent clients (scripts/load_test.py), before the long corpus runs.
# Each step has a time limit and its own log in OUT; a failed step is reported and the next one runs.
# OUT/summary.md: one line per step. CONLL_DIR: the corpus (default ../shared/data/conll2003).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:?usage: bash scripts/gpu_bench.sh OUT}")
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null || echo not-a-folder)" ]; then
  echo "error: $OUT: exists and is not an empty folder; the logs would overwrite what is there: choose a new OUT" >&2
  exit 2
fi
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ner_gpu_bench.XXXX")
CONLL=$(realpath "${CONLL_DIR:-../shared/data/conll2003}")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export NER_CACHE_DIR="$WORK/cache"
SUMMARY="$OUT/summary.md"
echo "# scripts/gpu_bench.sh $(date -u +%FT%TZ), work folder $WORK" > "$SUMMARY"
python -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'accelerate', accelerate.__version__, 'cuda', torch.cuda.is_available() and \
torch.cuda.get_device_name(0))" | tee -a "$SUMMARY"

if [ "${SMOKE:-0}" = 1 ]; then
  SENTENCES=200; VALID=100; TEXTS=2000; LIMIT=300; SAMPLE=10; RECIPE=(--max-steps 20); REQUESTS=5; PRECISION=no
  PLANS=("fixed 64x512" "fixed 128x1024"); GPU_BUDGET=(--batch-size 128 --max-tokens 1024)
else
  SENTENCES=14041; VALID=3250; TEXTS=100000; LIMIT=5000; SAMPLE=100; RECIPE=(); REQUESTS=50; PRECISION=bf16
  PLANS=("fixed 64x512" "fixed 256x2048" "fixed 1024x8192" "fixed 1024x16384" "fixed 4096x65536"); GPU_BUDGET=()
fi

step() {  # name, seconds, then the command: its log is OUT/name.log, its verdict a line of the summary
  local name=$1 limit=$2; shift 2
  local start=$EPOCHREALTIME
  timeout --kill-after 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local verdict=ok; [ $rc -eq 0 ] || verdict="FAILED (exit $rc)"
  echo "- $name: $verdict in $(python -c "print(f'{$EPOCHREALTIME - $start:.1f}')") s" | tee -a "$SUMMARY"
  return $rc
}

python_step() {  # name, then a Python program on stdin and its arguments: its output goes into the summary
  local name=$1; shift
  python - "$@" > "$OUT/$name.log" 2>&1 || echo "- $name: FAILED" >> "$SUMMARY"
  cat "$OUT/$name.log" >> "$SUMMARY"
}

# 1-2. Correctness: GPU tests, every backend (gpu_check.sh), and the CPU's fp32 weights, side by side.
FEW=(--max-steps 12 --batch-size 8 --max-tokens -1 --mixed-precision no --no-eval --quiet --seed 3
     --save-total-limit 1 --tokenization-cache none)
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  step gpu_tests 300 python -m pytest -q -m gpu tests/test_gpu.py tests/test_fp16.py &
  step cpu_fp32 300 env CUDA_VISIBLE_DEVICES= python -m ner.train --output-dir "$WORK/cpu/cpu_fp32" "${FEW[@]}" &
  OUT_DIR="$WORK/gpu_check" step gpu_check 400 bash scripts/gpu_check.sh
  wait
  tail -n 14 "$OUT/gpu_check.log" >> "$SUMMARY"; tail -n 3 "$OUT/gpu_tests.log" >> "$SUMMARY"
  python_step gpu_vs_cpu "$WORK" <<'PY'
import json, sys
from pathlib import Path
from safetensors.torch import load_file
work = Path(sys.argv[1])
def last(run):
    ckpt = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))[-1]
    losses = json.loads((ckpt / "trainer_state.json").read_text())["train_state"]["step_losses"]
    return losses, load_file(ckpt / "model" / "model.safetensors")
cpu_losses, cpu_weights = last(work / "cpu" / "cpu_fp32")
for run in ("accelerate_gpu", "raw_ddp_1", "data_parallel_1"):
    losses, weights = last(work / "gpu_check" / run)
    dl = max(abs(a - b) for a, b in zip(losses, cpu_losses))
    dw = max((weights[k].float() - cpu_weights[k].float()).abs().max().item() for k in weights)
    print(f"- {run} vs the CPU, fp32, 12 steps: max |dloss| {dl:.2e}, max |dweight| {dw:.2e}")
PY
fi

# 3. Training speed: the canonical loop vs ours over the same sentences, in one run.
step training_speed 420 python -m benchmarks.training_speed --sentences "$SENTENCES" --valid-sentences "$VALID" \
  --conll-dir "$CONLL" --out "$WORK/bench"
cp "$WORK/bench/bench.md" "$OUT/training_speed.md" 2>/dev/null

# 4. The CoNLL-2003 recipe, defaults, one seed.
step recipe 600 python -m ner.train --config scripts/conll2003.yaml --seed 1 --output-dir "$WORK/conll" \
  --train-file "$CONLL/train.txt" --validation-file "$CONLL/valid.txt" --test-file "$CONLL/test.txt" "${RECIPE[@]}"
tr '\r' '\n' < "$OUT/recipe.log" | grep -E "INFO (test|validation|epoch)|Model ready|resolved|auto" | tail -n 12 \
  >> "$SUMMARY"
MODEL="$WORK/conll/final"
[ -f "$MODEL/config.json" ] || MODEL=$(ls -d "$WORK"/bench/runs/*/final 2>/dev/null | tail -n 1)
echo "- model for steps 5-6: $MODEL" >> "$SUMMARY"

# 5. Inference budgets on CoNLL train sentences as raw texts.
step budgets 300 python -m benchmarks.batch_independence "$MODEL" "$CONLL/train.txt" --limit "$LIMIT" \
  --sample "$SAMPLE" --precisions "$PRECISION" --plans "${PLANS[@]}" --json "$OUT/budgets.json"
cat "$OUT/budgets.log" >> "$SUMMARY"

# 6. Serving under concurrent clients (before the long corpus runs: it is short).
step serve 200 python scripts/load_test.py "$MODEL" --clients 1 64 --requests "$REQUESTS" --max-seconds 30 \
  --json "$OUT/serve.json"
grep "^|" "$OUT/serve.log" >> "$SUMMARY"

# 5 (cont.). Whole corpus runs over TEXTS texts (CoNLL's sentences, cycled): the device's default budget, the
# CPU's, then ONNX (on a fifth of the texts where onnxruntime has no CUDA provider: it runs on the CPU).
python_step corpus_texts "$CONLL" "$TEXTS" "$WORK/corpus.jsonl" <<'PY'
import itertools, json, sys
from pathlib import Path
from benchmarks.inference import sentence_texts
conll, count, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
texts = [t for name in ("train", "valid", "test") for t in sentence_texts(conll / f"{name}.txt", None)[0]]
with out.open("w") as f:
    for text in itertools.islice(itertools.cycle(texts), count):
        f.write(json.dumps({"text": text}) + "\n")
print(f"- corpus: {count} texts from {len(texts)} CoNLL-2003 sentences")
PY
corpus() {  # name, model folder, then ner.predict flags: one whole-process corpus run
  local name=$1 model=$2 input=$3; shift 3
  step "corpus_$name" 240 python -m ner.predict "$model" "$input" --jsonl --output-dir "$WORK/$name" --quiet --merge "$@"
}
corpus default "$MODEL" "$WORK/corpus.jsonl" --mixed-precision "$PRECISION" "${GPU_BUDGET[@]}"
corpus cpu_budget "$MODEL" "$WORK/corpus.jsonl" --mixed-precision "$PRECISION" --batch-size 64 --max-tokens 512
step budgets_fp32 200 python -m benchmarks.batch_independence "$MODEL" "$CONLL/train.txt" --limit "$LIMIT" \
  --sample "$SAMPLE" --precisions no --plans "${PLANS[0]}" "${PLANS[-2]}" --json "$OUT/budgets_fp32.json"
cat "$OUT/budgets_fp32.log" >> "$SUMMARY"
step export_onnx 200 python -m ner.export "$MODEL" "$WORK/onnx_model" --onnx
python -c "import onnxruntime as o; print('- onnxruntime', o.__version__, 'providers:', o.get_available_providers())" \
  >> "$SUMMARY" 2>&1
if python -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())"; then
  cp "$WORK/corpus.jsonl" "$WORK/corpus_onnx.jsonl"
else
  head -n $((TEXTS / 5)) "$WORK/corpus.jsonl" > "$WORK/corpus_onnx.jsonl"
fi
step budgets_onnx 200 python -m benchmarks.batch_independence "$WORK/onnx_model" "$CONLL/train.txt" --limit "$LIMIT" \
  --sample "$SAMPLE" --precisions no --runtime onnx --plans "${PLANS[0]}" "${PLANS[-2]}" --json "$OUT/budgets_onnx.json"
cat "$OUT/budgets_onnx.log" >> "$SUMMARY"
corpus onnx "$WORK/onnx_model" "$WORK/corpus_onnx.jsonl" --runtime onnx
python_step corpus_agreement "$WORK" <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
runs = {p.name: p / "predictions.jsonl" for p in sorted(work.iterdir()) if (p / "predictions.jsonl").is_file()}
spans = {name: [[(e["start"], e["end"], e["type"]) for e in json.loads(line)["entities"]] for line in path.open()]
         for name, path in runs.items()}
ref = spans.get("default", [])
for name, found in spans.items():
    same = sum(a == b for a, b in zip(found, ref))
    print(f"- corpus {name}: {len(found)} texts; entity spans as in the default run for {same} of {len(found)}")
PY
