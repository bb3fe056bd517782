#!/bin/bash
# Training throughput on one GPU, every variant in one run (run by the device tool from the repo root):
#   plain PyTorch (eager, compiled) and train.py with each ColossalAI plugin, same model and data.
# Needs ColossalAI 0.5.0 + its transformers 4.51.3 stack as wheels in $WHEELS (default .whl/; see README.md here);
# the optional kernels' wheels there too (liger-kernel; flash-attn-4 and its CuTe DSL stack): without them only
# the variants that use them fail. MERGE_SITE: a folder of unpacked package files copied over the installed wheels
# (nvidia-cutlass-dsl-libs-cu13 is larger than one device call carries: an earlier call unpacks it there).
# Env: MODEL (JSON model keys), STEPS (train.py), PLAIN_STEPS (plain_torch.py's timed steps, default STEPS), WARMUP
# (lr warm-up steps, default 5), NUM_DOCS (generated documents, default 4000: 2.5 M tokens), VARIANTS, DEADLINE
# (seconds; later variants are skipped past it), VARIANT_TIMEOUT (seconds one plain variant may take), SCRATCH (where
# the data, checkpoints and final models go; default $OUT: the device tool brings back only a few small files).
# Variant names:
#   plain[+compile][+hf][+KERNEL...][+mbN][+cdt][+hybrid_adam][+bf16m][+fp8|+fp8row][+prof]   plain_torch.py
#        +hf: transformers' LlamaForCausalLM instead of lm.NativeLlama; +liger: all of Liger's kernels in the
#        native model, or one at a time with +liger_fused_ce, +liger_rms_norm, +liger_swiglu, +liger_rope;
#        +flash_attn_hopper: FlashAttention for Hopper; +mbN: micro-batch N; +cdt: Inductor's coordinate-descent
#        tuning; +hybrid_adam: ColossalAI's fused CUDA Adam instead of torch's fused AdamW; +prof: profile summary
#        +bf16m: precision bf16_master (else bf16 autocast); +fp8 / +fp8row: fp8 tensorwise / rowwise (torchao)
#   PLUGIN[+compile][+hf][+KERNEL...][+det][+bf16m][+fp8|+fp8row][+mbN]   workflows/scripts/train.py with that
#        plugin (+hf: model_impl hf; +det: "deterministic": true, deterministic CUDA kernels and no TF32; the
#        others as for plain)
# PARITY=1: afterwards, benchmarks/loss_parity.py compares every train.py variant's losses with the first one's
#   (1% at every logged step) and appends the result lines to results.jsonl.
# GENERATOR: preprocess.py's --generator (prose, the default, or hard: the parity corpus, docs/training.md).
# JOBS: variants run at once (default 1). Above 1 they share the GPU, so their throughput means nothing (their result
#   lines say "shared_gpu": true): for parity runs, and to fill Inductor's and Triton's caches (/tmp) before a call
#   on the same machine measures the same variants one at a time.
# LABEL: written into every result line ("call"), so lines of one call are found together.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$(mktemp -d)}
SCRATCH=${SCRATCH:-$OUT}
mkdir -p "$OUT" "$SCRATCH"
SITE=/tmp/site
WHEELS=${WHEELS:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE $WHEELS/*.whl || exit 1
[ -n "${MERGE_SITE:-}" ] && cp -a "$MERGE_SITE"/. $SITE/
export PYTHONPATH=$SITE
# pip --target leaves .pth files unread; nvidia-cutlass-dsl's adds this folder (where `import cutlass` lives).
[ -d $SITE/nvidia_cutlass_dsl/dsl_packages ] && PYTHONPATH=$PYTHONPATH:$SITE/nvidia_cutlass_dsl/dsl_packages
MODEL=${MODEL:-'"n_layer":24,"n_head":16,"d_model":1024,"seq_len":1024,"vocab":50304,"micro_batch":16'}
STEPS=${STEPS:-30}
DEADLINE=${DEADLINE:-540}
VARIANTS=${VARIANTS:-"plain plain+compile torch_ddp torch_ddp+compile low_level_zero hybrid gemini"}
COMMON="$MODEL,\"steps\":$STEPS,\"warmup\":${WARMUP:-5},\"log_every\":10,\"ckpt_every\":0"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c 'import torch, colossalai, transformers; print("torch", torch.__version__, "colossalai", colossalai.__version__, "transformers", transformers.__version__)' | tee -a $OUT/gpu.txt
python3 workflows/scripts/preprocess.py --out-dir $SCRATCH/data --num-docs ${NUM_DOCS:-4000} --generator ${GENERATOR:-prose} > /dev/null || exit 1
JOBS=${JOBS:-1}
TAG="\"call\": \"${LABEL:-}\", \"shared_gpu\": $([ "$JOBS" -gt 1 ] && echo true || echo false)"
tag() { sed "s/^{/{$TAG, /"; }  # every result line says which call made it and whether the GPU was shared
has() { [[ "+$1+" == *"+$2+"* ]]; }
kernels_of() { tr '+' '\n' <<<"$1" | grep -E '^(liger|flash_attn)' | paste -sd, -; }
variant() {  # one variant: its result line goes to results.jsonl
  local v=$1 t0=$SECONDS
  local base=${v%%+*}
  # Config keys both scripts read from their --config-json: micro-batch, precision, fp8.
  local extra=""
  local mb=$(tr '+' '\n' <<<"$v" | sed -n 's/^mb\([0-9]*\)$/\1/p')
  [ -n "$mb" ] && extra="$extra,\"micro_batch\":$mb"
  has "$v" bf16m && extra="$extra,\"precision\":\"bf16_master\"" || extra="$extra,\"precision\":\"bf16\""
  has "$v" fp8 && extra="$extra,\"fp8\":\"tensorwise\""
  has "$v" fp8row && extra="$extra,\"fp8\":\"rowwise\""
  if [ "$base" = plain ]; then
    local flags=""
    has "$v" compile && flags="$flags --compile"
    has "$v" hf && flags="$flags --model-impl hf"
    local ks=$(kernels_of "$v")
    [ -n "$ks" ] && flags="$flags --kernels $ks"
    has "$v" hybrid_adam && extra="$extra,\"optimizer\":\"hybrid_adam\""
    has "$v" cdt && flags="$flags --inductor-tuning"
    has "$v" prof && flags="$flags --profile"
    flags="$flags --config-json {$COMMON$extra}"
    # Only the JSON line goes to the results (ColossalAI's JIT builds print to stdout too).
    : > $OUT/$v.log
    timeout ${VARIANT_TIMEOUT:-600} python3 benchmarks/gpu/plain_torch.py --data-dir $SCRATCH/data --steps ${PLAIN_STEPS:-$STEPS} $flags \
      2>> $OUT/$v.log | tee -a $OUT/$v.log | grep '^{' | tag >> $OUT/results.jsonl \
      || echo "{\"variant\": \"$v\", \"error\": \"no result line (failed, or past VARIANT_TIMEOUT); its log ends: $(tail -1 $OUT/$v.log | tr -d '"\\')\"}" | tag >> $OUT/results.jsonl
  else
    local comp=false impl=auto det=false
    has "$v" compile && comp=true
    has "$v" det && det=true
    has "$v" hf && impl=hf
    local ks=$(kernels_of "$v" | sed '/./s/\([^,]*\)/"\1"/g')  # none: an empty list
    timeout ${VARIANT_TIMEOUT:-600} python3 -m torch.distributed.run --standalone --nproc_per_node=1 workflows/scripts/train.py \
      --data-dir $SCRATCH/data --out $SCRATCH/$v/model.pt --ckpt-dir $SCRATCH/$v/ckpt --metrics $OUT/$v/metrics.jsonl \
      --config-json "{$COMMON$extra,\"plugin\":\"$base\",\"compile\":$comp,\"deterministic\":$det,\"model_impl\":\"$impl\",\"kernels\":[$ks]}" > $OUT/$v.log 2>&1
    python3 benchmarks/gpu/summarize.py "$v" $OUT/$v/metrics.jsonl | tag >> $OUT/results.jsonl
  fi
  echo "== $v $((SECONDS - t0)) s: $(grep "\"variant\": \"$v\"" $OUT/results.jsonl | tail -1 | cut -c1-600)"
}
trained=""
for v in $VARIANTS; do
  if [ $SECONDS -gt $DEADLINE ]; then echo "skip $v: past the deadline"; continue; fi
  [ "${v%%+*}" = plain ] || trained="$trained $v"
  if [ "$JOBS" -gt 1 ]; then
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    variant "$v" &
    sleep 2  # staggered starts: the data and the first imports do not all land at once
  else
    variant "$v"
  fi
done
wait
if [ -n "${PARITY:-}" ]; then
  set -- $trained
  first=$1; shift
  [ $# -gt 0 ] && python3 benchmarks/loss_parity.py $OUT/$first/metrics.jsonl $(for v in "$@"; do echo $OUT/$v/metrics.jsonl; done) \
    | tag | tee -a $OUT/results.jsonl
fi
