#!/usr/bin/env bash
# bash scripts/gpu_check.sh            # on a machine with 1+ NVIDIA GPUs; about 3 minutes
#
# Trains the packaged MiniLM for a few steps on the shipped sample through every backend and
# checks that they agree: Accelerate (gpu.yaml, and multi_gpu.yaml when 2+ GPUs), raw DDP under
# torchrun, and nn.DataParallel. fp32 (--mixed-precision no) so agreement is tight; then one bf16
# Accelerate run to show the default precision path works, and fp16 on each backend (gradient
# scaler: Accelerate's own, and torch.amp.GradScaler in the raw ones). Prints one line per run and
# a verdict. The fp16 overflow and resume tests: python -m pytest -m gpu tests/test_fp16.py
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT_DIR:-/tmp/ner_gpu_check}
# Only a folder this script made (it leaves .ner-gpu-check in it) is emptied; anything else is refused.
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
  [ -f "$OUT/.ner-gpu-check" ] || { echo "error: $OUT is not empty and was not made by this script;" \
    "choose another OUT_DIR=... or remove it yourself"; exit 2; }
  rm -rf "$OUT"
fi
mkdir -p "$OUT" && touch "$OUT/.ner-gpu-check"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
echo "GPUs visible: $GPUS ($(python -c 'import torch; print(torch.cuda.get_device_name(0))'))"
[ "$GPUS" -ge 1 ] || { echo "no GPU: nothing to check"; exit 1; }
COMMON=(--max-steps 12 --batch-size 8 --max-tokens -1 --mixed-precision no --no-eval --quiet --seed 3
        --save-total-limit 1 --tokenization-cache none)

run() {  # name, then the command; records the last checkpoint's losses
  local name=$1; shift
  local start=$SECONDS
  "$@" --output-dir "$OUT/$name" "${COMMON[@]}" > "$OUT/$name.log" 2>&1 || { echo "$name FAILED"; tail -20 "$OUT/$name.log"; exit 1; }
  echo "$name: ok in $((SECONDS - start)) s"
}

run accelerate_gpu accelerate launch --config_file accelerate_configs/gpu.yaml ner/train.py
run raw_ddp_1 torchrun --standalone --nproc_per_node=1 -m ner.train --raw-ddp
run data_parallel_1 env CUDA_VISIBLE_DEVICES=0 python -m ner.train --data-parallel
if [ "$GPUS" -ge 2 ]; then
  # Same global batch as the 1-GPU runs: 2 GPUs x 4 sentences.
  COMMON[3]=4
  run accelerate_multi accelerate launch --config_file accelerate_configs/multi_gpu.yaml --num_processes 2 ner/train.py
  run raw_ddp_2 torchrun --standalone --nproc_per_node=2 -m ner.train --raw-ddp
  COMMON[3]=8
  run data_parallel_2 env CUDA_VISIBLE_DEVICES=0,1 python -m ner.train --data-parallel
fi
COMMON[7]=bf16
run accelerate_bf16 accelerate launch --config_file accelerate_configs/gpu.yaml ner/train.py
COMMON[7]=fp16
run accelerate_fp16 accelerate launch --config_file accelerate_configs/gpu.yaml ner/train.py
run raw_ddp_fp16 torchrun --standalone --nproc_per_node=1 -m ner.train --raw-ddp
run data_parallel_fp16 env CUDA_VISIBLE_DEVICES=0 python -m ner.train --data-parallel

python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from safetensors.torch import load_file
out = Path(sys.argv[1])
def last(run):
    ckpt = sorted((out / run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))[-1]
    return json.loads((ckpt / "trainer_state.json").read_text())["train_state"]["step_losses"], \
        load_file(ckpt / "model" / "model.safetensors")
runs = [p.name for p in sorted(out.iterdir()) if p.is_dir()]
ref_losses, ref_weights = last("accelerate_gpu")
ok = True
for run in runs:
    losses, weights = last(run)
    dl = max(abs(a - b) for a, b in zip(losses, ref_losses))
    dw = max((weights[k].float() - ref_weights[k].float()).abs().max().item() for k in weights)
    tol = 5e-2 if run.endswith(("bf16", "fp16")) else (2e-3 if run.endswith(("_2", "_multi")) else 1e-4)
    verdict = "agree" if dl <= tol else "DIFFER"
    ok &= verdict == "agree"
    print(f"{run:18s} final loss {losses[-1]:.5f}  max |dloss| {dl:.2e}  max |dweight| {dw:.2e}  {verdict}")
print("ALL BACKENDS AGREE" if ok else "BACKENDS DISAGREE")
sys.exit(0 if ok else 1)
PY
