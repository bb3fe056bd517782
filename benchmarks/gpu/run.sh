#!/bin/bash
# Training throughput on one GPU, every variant in one run (run by the device tool from the repo root):
#   plain PyTorch (eager, compiled) and train.py with each ColossalAI plugin, same model and data.
# Needs ColossalAI 0.5.0 + its transformers 4.51.3 stack as wheels in .whl/ (see README.md here); liger-kernel's
# wheel there too for the +liger variants (optional: without it those variants fail alone).
# Env: MODEL (JSON model keys), STEPS, VARIANTS, DEADLINE (seconds; later variants are skipped past it),
# VARIANT_TIMEOUT (seconds one plain variant may take).
# Variant names:
#   plain[+compile][+hf][+KERNEL...][+mbN][+prof]   benchmarks/gpu/plain_torch.py (+hf: transformers' LlamaForCausalLM
#        instead of lm.NativeLlama; +liger: all of Liger's kernels in the native model, or one at a time with
#        +liger_fused_ce, +liger_rms_norm, +liger_swiglu, +liger_rope; +mbN: micro-batch N; +prof: profile summary)
#   PLUGIN[+compile][+hf]                  workflows/scripts/train.py with that plugin (+hf: model_impl hf)
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$(mktemp -d)}
SITE=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || exit 1
export PYTHONPATH=$SITE
MODEL=${MODEL:-'"n_layer":24,"n_head":16,"d_model":1024,"seq_len":1024,"vocab":50304,"micro_batch":16'}
STEPS=${STEPS:-30}
DEADLINE=${DEADLINE:-540}
VARIANTS=${VARIANTS:-"plain plain+compile torch_ddp torch_ddp+compile low_level_zero hybrid gemini"}
COMMON="$MODEL,\"precision\":\"bf16\",\"steps\":$STEPS,\"warmup\":5,\"log_every\":10,\"ckpt_every\":0"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c 'import torch, colossalai, transformers; print("torch", torch.__version__, "colossalai", colossalai.__version__, "transformers", transformers.__version__)' | tee -a $OUT/gpu.txt
python3 workflows/scripts/preprocess.py --out-dir $OUT/data --num-docs 4000 > /dev/null || exit 1
has() { [[ "+$1+" == *"+$2+"* ]]; }
for v in $VARIANTS; do
  if [ $SECONDS -gt $DEADLINE ]; then echo "skip $v: past the deadline"; continue; fi
  t0=$SECONDS
  base=${v%%+*}
  if [ "$base" = plain ]; then
    flags=""
    has "$v" compile && flags="$flags --compile"
    has "$v" hf && flags="$flags --model-impl hf"
    ks=$(tr '+' '\n' <<<"$v" | grep -E '^liger' | paste -sd, -)
    [ -n "$ks" ] && flags="$flags --kernels $ks"
    mb=$(tr '+' '\n' <<<"$v" | sed -n 's/^mb\([0-9]*\)$/\1/p')
    [ -n "$mb" ] && flags="$flags --config-json {$COMMON,\"micro_batch\":$mb}"
    has "$v" prof && flags="$flags --profile"
    [[ "$flags" == *--config-json* ]] || flags="$flags --config-json {$COMMON}"
    timeout ${VARIANT_TIMEOUT:-600} python3 benchmarks/gpu/plain_torch.py --data-dir $OUT/data --steps $STEPS $flags \
      >> $OUT/results.jsonl 2> $OUT/$v.log || echo "{\"variant\": \"$v\", \"error\": \"$(tail -1 $OUT/$v.log | tr -d '"\\')\"}" >> $OUT/results.jsonl
  else
    comp=false; impl=auto
    has "$v" compile && comp=true
    has "$v" hf && impl=hf
    python3 -m torch.distributed.run --standalone --nproc_per_node=1 workflows/scripts/train.py \
      --data-dir $OUT/data --out $OUT/$v/model.pt --ckpt-dir $OUT/$v/ckpt --metrics $OUT/$v/metrics.jsonl \
      --config-json "{$COMMON,\"plugin\":\"$base\",\"compile\":$comp,\"model_impl\":\"$impl\"}" > $OUT/$v.log 2>&1
    python3 benchmarks/gpu/summarize.py "$v" $OUT/$v/metrics.jsonl >> $OUT/results.jsonl
  fi
  echo "== $v $((SECONDS - t0)) s: $(tail -1 $OUT/results.jsonl | cut -c1-600)"
done
