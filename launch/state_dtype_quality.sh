#!/usr/bin/env bash
# What bf16 optimizer state (--optimizer_state_dtype bfloat16) does to training: the same run with
# float32 and with bfloat16 moments, at 1 rank and at RANKS ranks, on the built-in synthetic corpus,
# and the final training and evaluation losses side by side in OUT/state_dtype_quality.md.
#
#   bash launch/state_dtype_quality.sh                       # llama_20m, 300 steps, 1 and 4 ranks
#   STEPS=100 RANKS=2 OUT=/tmp bash launch/state_dtype_quality.sh
#   OPTIMIZER="--optimizer adamw_sn" bash launch/state_dtype_quality.sh
#
# The recipe is launch/quality_runs.sh's (lr LR, 3e-3 by default); each rank takes its share of the
# machine's cores for LibTorch's threads. About 15 minutes on two cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/quality_runs.sh
quality_setup state_dtype_quality.sh
RANKS=${RANKS:-4}
RUNS=${RUNS_DIR:-runs/state_dtype_quality}
read -r -a optimizer <<<"${OPTIMIZER:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
[[ "$RANKS" =~ ^[1-9][0-9]*$ ]] && [ $((8 % RANKS)) = 0 ] || { echo "state_dtype_quality.sh: RANKS: expected 1, 2, 4 or 8 (a share of the global batch of 8; got '$RANKS')" >&2; exit 2; }

for ranks in 1 "$RANKS"; do
  for dtype in float32 bfloat16; do
    quality_run "$RUNS/w${ranks}_$dtype" $((cores / ranks > 0 ? cores / ranks : 1)) \
      mpirun --oversubscribe -np "$ranks" -- --batch_size $((8 / ranks)) --optimizer_state_dtype "$dtype" \
      ${optimizer[@]+"${optimizer[@]}"}
  done
  [ "$RANKS" = 1 ] && break
done

python3 - "$OUT/state_dtype_quality.md" "$CONFIG" "$STEPS" "$LR" "${OPTIMIZER:-}" "${dirs[@]}" <<'PY'
import pathlib, sys
sys.path.insert(0, "launch")
from quality_summary import events, final_losses

out, config, steps, lr, optimizer, *dirs = sys.argv[1:]
rows, by = [], {}
for folder in dirs:
    start = events(folder, "start")[0]
    ranks, dtype = pathlib.Path(folder).name[1:].split("_", 1)
    by[(ranks, dtype)] = (*final_losses(folder), start.get("optimizer_state_bytes"))
for (ranks, dtype), (train, evaluation, state) in by.items():
    base = by.get((ranks, "float32"))
    diff = "" if dtype == "float32" else f"{train - base[0]:+.4f} / {evaluation - base[1]:+.4f}"
    rows.append(f"| {ranks} | {dtype} | {train:.4f} | {evaluation:.4f} | {diff} | {state / 2**20:.1f} |")
text = f"""# bf16 optimizer state: what it does to the loss

`bash launch/state_dtype_quality.sh` ({config}, {steps} steps{', ' + optimizer if optimizer else ', AdamW'}, the synthetic corpus,
global batch 8 x 128 tokens, lr {lr}, CPU). Final training loss: the mean of the last 20 steps; evaluation:
the last evaluation (16 held-out sequences). Difference: bf16 minus float32 at the same world size.

| ranks | optimizer state | final training loss | final eval loss | bf16 - fp32 (train / eval) | state per rank (MiB) |
|---:|---|---:|---:|---|---:|
""" + "\n".join(rows) + "\n"
pathlib.Path(out).write_text(text)
print(text)
PY
