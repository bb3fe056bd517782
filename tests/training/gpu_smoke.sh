#!/bin/bash
# Smoke test of train.py's CUDA paths on a GPU machine (not part of pytest): bf16 autocast + torch.compile +
# fused AdamW (torch_ddp), low_level_zero bf16 with a stop/resume, hybrid bf16 with ColossalAI flash
# attention, gemini (JIT-builds HybridAdam's kernels on a fresh machine, ~2 min), evaluate.py on each final
# model, and the causality check of the GPU-wrapped models.
# Usage, from the repo root, with ColossalAI 0.5.0 + transformers 4.51.3 importable:
#   bash tests/training/gpu_smoke.sh [NPROC] [PLUGINS...]     (results under $OUT, default a temp dir)
set -uo pipefail
NPROC=${1:-1}; shift || true
PLUGINS=${*:-ddp llz hybrid gemini}
OUT=${OUT:-$(mktemp -d)}
S=workflows/scripts
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
TR="python3 -m torch.distributed.run --standalone --nproc_per_node=$NPROC"
M='"n_layer":8,"n_head":8,"d_model":512,"seq_len":512,"micro_batch":16,"steps":40,"warmup":5,"log_every":10'
M="$M,\"ckpt_every\":20,\"lr\":0.001,\"precision\":\"bf16\""
python3 $S/preprocess.py --out-dir "$OUT/data" --num-docs 2000 || exit 1

train() {  # name, extra config
  local t0=$SECONDS
  $TR $S/train.py --data-dir "$OUT/data" --out "$OUT/$1/model.pt" --ckpt-dir "$OUT/$1/ckpt" \
    --metrics "$OUT/$1/metrics.jsonl" --config-json "{$M,$2}" >>"$OUT/$1.log" 2>&1
  local rc=$?
  echo "== $1 rc=$rc $((SECONDS - t0))s: $(grep -E '^(step|done|resumed|stop_after)' "$OUT/$1.log" | tail -3 | tr '\n' '|')"
  [ $rc = 0 ] || grep -E "Error|error" "$OUT/$1.log" | tail -5
}
evaluate() {
  python3 $S/evaluate.py --model "$OUT/$1/model.pt" --data-dir "$OUT/data" --metrics-in "$OUT/$1/metrics.jsonl" \
    --out-json "$OUT/$1/eval.json" --plot "$OUT/$1/loss.png" 2>&1 | tail -1
}
for p in $PLUGINS; do
  case $p in
    ddp) train ddp '"plugin":"torch_ddp","compile":true'; evaluate ddp ;;
    llz) train llz '"plugin":"low_level_zero","stop_after":20'; train llz '"plugin":"low_level_zero"'; evaluate llz ;;
    hybrid) train hybrid '"plugin":"hybrid"'; evaluate hybrid ;;
    gemini) train gemini '"plugin":"gemini"'; evaluate gemini ;;
  esac
done
C='"n_layer":2,"n_head":4,"d_model":128,"seq_len":64,"precision":"bf16"'
$TR tests/training/causality_check.py "$OUT/causality.json" "ddp_bf16={$C}" "llz_bf16={$C,\"plugin\":\"low_level_zero\"}" \
  "hybrid_bf16_flash={$C,\"plugin\":\"hybrid\"}" >"$OUT/causality.log" 2>&1
echo "== causality rc=$?: $(tr -d '\n ' <"$OUT/causality.json" 2>/dev/null)"
