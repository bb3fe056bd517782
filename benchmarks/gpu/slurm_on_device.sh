#!/bin/bash
# A first job on the lent GPU machine, the whole path (docs/first-job.md), in one device call:
#   1. workflows/examples/minimal_train.py under plain torchrun: NCCL on the GPU, bf16, periodic checkpoints;
#   2. the same under `multinode torchrun` outside SLURM (profile ethernet): SIGUSR2 by pid mid-run makes it
#      checkpoint and end with 85; the same command again resumes and finishes;
#   3. a one-node SLURM 22.05 on this machine with its GPUs as gres (SLURM and munge carried as files, no
#      accounting), then `multinode check`, `multinode preview` and `snakemake --executor multinode` on a GPU rule:
#      sbatch -> job script -> node check (real nvidia-smi) -> srun -> `multinode torchrun` -> torchrun -> NCCL; a
#      USR2 to the job's steps mid-run (scancel --signal, as SLURM's signal before the time limit) makes it checkpoint,
#      requeue itself and resume. The GPU sampler's CSV, the progress lines' MFU and CUDA_VISIBLE_DEVICES are read;
#   4. on that cluster (proctrack/linuxproc: SLURM signals every process of a step), a training whose DataLoaders
#      have spawn and forkserver workers, in a user's own srun step, gets scancel --signal=USR2: as it is, with its
#      workers ignoring USR2 from their start, and with USR2 blocked in the rank (tests/training/usr2_dataloader.py).
# What it needs, carried (benchmarks/gpu/carry_first_job.sh CARRY, here): CARRY/repo, CARRY/whl, CARRY/slurm. On the
# device (the run tool, carry [".gpu"]):  bash .gpu/first-job/repo/benchmarks/gpu/slurm_on_device.sh .gpu/first-job
# Results in $OUT: first-job.log (everything), results-first-job.json (first_job_checks.py: every check and number),
# and the SLURM job's log, GPU samples, metrics and Snakemake's output as they were written.
# Root only (daemons, /etc/slurm, cgroups); it changes the machine: run it on a lent one, never on a shared host.
# CONF_ONLY=1 DIR=...: only write slurm.conf, gres.conf and cgroup.conf for this machine into DIR (no root needed;
# tests/process/test_gpu_scripts.py runs it).
set -uo pipefail
CARRY=$(cd "${1:?usage: slurm_on_device.sh CARRY}" && pwd)
REPO=$CARRY/repo
OUT=${OUT:-$(mktemp -d)}
WORK=${WORK:-/tmp/first-job}
WF=$WORK/wf  # part 3: the workflow
P=/opt/sl  # the SLURM files' prefix: never unpacked over /
STEPS_PLAIN=${STEPS_PLAIN:-600} STEPS_LOCAL=${STEPS_LOCAL:-1000} STEPS_JOB=${STEPS_JOB:-1500}
SIGNAL_AT=${SIGNAL_AT:-400}  # the step after which SIGUSR2 is sent (parts 2 and 3)
MODEL=${MODEL:-"--width 8192 --batch 8192 --log-every 50"}
PARTS=${PARTS:-"1 2 3 4"}  # a part left out is skipped (a CPU try of parts 1 and 2: PARTS="1 2" MODEL=...)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

slurm_conf() {  # DIR NODE_LINE GPUS: the three files of a one-node cluster whose GPUs are gres
    local dir=$1 node=$2 gpus=$3 host=${2#NodeName=}
    host=${host%% *}
    mkdir -p "$dir"
    cat >"$dir/slurm.conf" <<EOF
ClusterName=firstjob
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also the delay before a requeued job may start again (default 120 s)
AuthInfo=cred_expire=10
PluginDir=$P/usr/lib/x86_64-linux-gnu/slurm-wlm
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2
KillWait=5
MinJobAge=300
ReturnToService=2
MpiDefault=none
SlurmctldLogFile=/var/log/slurm/ctld.log
SlurmdLogFile=/var/log/slurm/d.log
$node Gres=gpu:$gpus State=UNKNOWN
PartitionName=gpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    : >"$dir/gres.conf"
    for ((i = 0; i < gpus; i++)); do echo "NodeName=$host Name=gpu File=/dev/nvidia$i" >>"$dir/gres.conf"; done
    printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n' >"$dir/cgroup.conf"
}

gpu_count() { nvidia-smi -L | grep -c '^GPU '; }

if [ -n "${CONF_ONLY:-}" ]; then
    slurm_conf "${DIR:?DIR=...}" "$(slurmd -C | head -n 1)" "${GPUS:-$(gpu_count)}"
    exit
fi

mkdir -p "$OUT" "$WORK"
LOG=$OUT/first-job.log
exec > >(tee -a "$LOG") 2>&1
T0=$SECONDS
say() { echo "== [$((SECONDS - T0))s] $*"; }
wait_for_step() {  # METRICS_GLOB STEP LIMIT_S: until a step line >= STEP is in the file (0) or the limit (1)
    local deadline=$((SECONDS + $3))
    while [ $SECONDS -lt $deadline ]; do
        # shellcheck disable=SC2086
        if cat $1 2>/dev/null | python3 -c "import json,sys; sys.exit(0 if any(json.loads(l).get('step',0) >= $2 and 'event' not in json.loads(l) for l in sys.stdin if l.strip()) else 1)"; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

say "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import sys, torch; print("python", sys.version.split()[0], sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)'
SITE=/tmp/site
if [ -z "${NO_INSTALL:-}" ]; then  # NO_INSTALL=1: the multinode and snakemake on PATH (a try here)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE "$CARRY"/whl/*.whl || exit 1
    export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
fi
echo "multinode $(multinode --version) at $(command -v multinode); snakemake $(snakemake --version)"

part() { [[ " $PARTS " == *" $1 "* ]]; }
if part 1; then
say "1. minimal_train.py under plain torchrun"
mkdir -p "$WORK/plain" && cd "$WORK/plain" || exit 1
MULTINODE_METRICS_FILE=$WORK/plain/metrics.jsonl timeout 180 python3 -m torch.distributed.run --standalone \
    --nproc_per_node=1 "$REPO/workflows/examples/minimal_train.py" ckpt.pt "$STEPS_PLAIN" --ckpt-every 200 $MODEL
echo "plain torchrun exit $?"
fi

if part 2; then
say "2. multinode torchrun outside SLURM, SIGUSR2 at step $SIGNAL_AT, then the same command again"
mkdir -p "$WORK/local" && cd "$WORK/local" || exit 1
LOCAL_METRICS="$WORK/local/.snakemake/multinode/torchrun/*.metrics.jsonl"
export SNAKEMAKE_MULTINODE_ENV_PROFILE=ethernet
multinode torchrun "$REPO/workflows/examples/minimal_train.py" ckpt.pt "$STEPS_LOCAL" --ckpt-every 250 $MODEL &
pid=$!
if wait_for_step "$LOCAL_METRICS" "$SIGNAL_AT" 150; then
    echo "SIGUSR2 to multinode torchrun (pid $pid) at $(date +%s.%N)"
    kill -USR2 $pid
fi
wait $pid
echo "local run 1 exit $?"
timeout 150 multinode torchrun "$REPO/workflows/examples/minimal_train.py" ckpt.pt "$STEPS_LOCAL" --ckpt-every 250 $MODEL
echo "local run 2 exit $?"
unset SNAKEMAKE_MULTINODE_ENV_PROFILE
fi

if part 3 || part 4; then
say "3. a one-node SLURM with the GPU as gres"
mkdir -p $P && cp -a "$CARRY/slurm/root/." $P/ && mkdir -p $P/libs
for lib in "$CARRY"/slurm/libs/*; do  # only what this machine lacks: LD_LIBRARY_PATH comes before its own
    ldconfig -p | awk '{print $1}' | grep -qx "$(basename "$lib")" || cp "$lib" $P/libs/
done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$P/usr/lib/x86_64-linux-gnu:$P/usr/lib/x86_64-linux-gnu/slurm-wlm:$P/libs
export PATH=$P/usr/sbin:$P/usr/bin:$PATH SLURM_CONF=/etc/slurm/slurm.conf
for b in slurmd slurmctld slurmstepd; do ln -sf $P/usr/sbin/$b-wlm $P/usr/sbin/$b; done
[ -e /usr/sbin/slurmstepd ] || ln -s $P/usr/sbin/slurmstepd-wlm /usr/sbin/slurmstepd  # slurmd's compiled-in path
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge /var/spool/slurmd /var/spool/slurmctld /var/log/slurm
head -c 1024 /dev/urandom >/etc/munge/munge.key && chmod 400 /etc/munge/munge.key
munged --force || exit 1
slurm_conf /etc/slurm "$(slurmd -C | head -n 1)" "$(gpu_count)"
# cgroup v2: slurmd 22.05 starts only with the controllers enabled below the root and a system.slice
mkdir -p /sys/fs/cgroup/system.slice
echo "+cpuset +cpu +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control
echo "+cpuset +cpu +memory +pids" >/sys/fs/cgroup/system.slice/cgroup.subtree_control
slurmctld && sleep 2 && slurmd || { tail -n 20 /var/log/slurm/*.log; exit 1; }
for _ in $(seq 30); do sinfo -h -o %T | grep -q idle && break; sleep 1; done
sinfo -N -o "%N %T %G %c %m"; sinfo -V
timeout 60 srun --gres=gpu:1 bash -c 'echo "srun --gres=gpu:1: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L'
fi

if part 3; then

say "3. the workflow: multinode check, multinode preview, snakemake --executor multinode"

mkdir -p "$WF/profiles/device" && cd "$WF" || exit 1
cp "$REPO/workflows/examples/minimal_train.py" .
cat >Snakefile <<EOF
rule train:
    output: "model.pt"
    resources: nodes=1, gpus=1, cpus_per_task=8, mem_mb=32000, runtime=20
    shell:
        'echo "job step: CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES SLURM_GPUS_ON_NODE=\$SLURM_GPUS_ON_NODE"; '
        "mkdir -p ckpt && multinode torchrun minimal_train.py ckpt/model.pt $STEPS_JOB --ckpt-every 400 $MODEL "
        "&& cp ckpt/model.pt {output}"
EOF
cat >profiles/device/env.yaml <<'EOF'
profiles:
  device:
    extends: ethernet
    nccl: {debug: INFO, debug_subsys: INIT}  # NCCL says which device and interface it took
EOF
cat >profiles/device/config.yaml <<EOF
executor: multinode
jobs: 1
latency-wait: 5
scheduler: greedy
multinode-partition: gpu
multinode-profile-file: $WF/profiles/device/env.yaml
multinode-env-profile: device
multinode-gpu-sample-seconds: 2
multinode-progress-seconds: 5
multinode-snapshot: minimal_train.py
EOF
timeout 120 multinode check --workflow-profile profiles/device
echo "multinode check exit $?"
timeout 120 multinode preview --rule train --workflow-profile profiles/device >"$OUT/preview.sh"
echo "multinode preview exit $? ($(wc -l <"$OUT/preview.sh") lines)"
JOB_METRICS="$WF/.snakemake/multinode/logs/rule_train/*/*.attempt1.metrics.jsonl"
timeout 420 snakemake --workflow-profile profiles/device >"$WORK/snakemake.log" 2>&1 &
smk=$!
if wait_for_step "$JOB_METRICS" "$SIGNAL_AT" 240; then
    job=$(squeue -h -o %i | head -n 1)
    echo "scancel --signal=USR2 $job at $(date +%s.%N)"
    scancel --signal=USR2 "$job"
fi
wait $smk
echo "snakemake exit $?"
cat "$WORK/snakemake.log"
multinode status
ls -la "$WF" "$WF"/.snakemake/multinode/logs/rule_train/*/
fi

if part 4; then
say "4. SLURM's own USR2 under proctrack/linuxproc (every process of a step): DataLoader workers (spawn, forkserver)"
mkdir -p "$WORK/dl" && cd "$WORK/dl" || exit 1
# plain: as it is; ignore: the workers ignore USR2 from their start (worker_init_fn); block: the rank blocks USR2 and
# takes it in a thread (as minimal_train.py does), so every process it starts starts with it blocked
for mode in plain ignore block; do
    flag=()
    [ $mode = ignore ] && flag=(--ignore-usr2-in-workers)
    [ $mode = block ] && flag=(--block-usr2)
    MULTINODE_METRICS_FILE=$PWD/metrics-$mode.jsonl MULTINODE_PREEMPT_FILE=$PWD/preempted-$mode timeout 150 \
        srun --gres=gpu:1 -N1 --ntasks-per-node=1 --job-name=dl-$mode multinode torchrun --nproc_per_node=1 \
        "$REPO/tests/training/usr2_dataloader.py" "ckpt-$mode.pt" "${flag[@]}" &
    step=$!
    for _ in $(seq 240); do grep -qs '"event": "workers"' "metrics-$mode.jsonl" && break; sleep 0.5; done
    job=$(squeue -h -n "dl-$mode" -o %i | head -n 1)
    echo "dataloader $mode: scancel --signal=USR2 $job at $(date +%s.%N)"
    scancel --signal=USR2 "$job"
    wait $step
    echo "dataloader $mode exit $?"
done
fi

say "checks"
python3 "$REPO/benchmarks/gpu/first_job_checks.py" --work "$WORK" --log "$LOG" >"$OUT/results-first-job.json"
cat "$OUT/results-first-job.json"
for f in "$WF"/.snakemake/multinode/logs/rule_train/*/*.attempt1.log \
    "$WF"/.snakemake/multinode/logs/rule_train/*/*.attempt1.restart1.log \
    "$WF"/.snakemake/multinode/logs/rule_train/*/*.gpu.csv "$WORK/snakemake.log"; do
    [ -e "$f" ] && cp "$f" "$OUT/"
done
say "done"
