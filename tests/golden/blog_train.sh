#!/bin/bash
# Snakemake rule train
# Written by snakemake-executor-plugin-multinode; `multinode preview` prints the same script.
# Code: as the command names it
# ==== 1. resources ===============================================================================
#SBATCH --job-name=mn-0123abcd-train
#SBATCH --comment=rule_train_wildcards__
#SBATCH --output=.snakemake/multinode/logs/rule_train/_/%j.attempt1.log
#SBATCH --open-mode=append
#SBATCH --export=ALL
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=64
#SBATCH --gres=gpu:8
#SBATCH --partition=gpu_A6000
#SBATCH --account=your_account
#SBATCH --time=20160
#SBATCH --mem=400000M
#SBATCH --nodelist=node110,node111
#SBATCH --signal=USR2@120
#SBATCH --requeue

# The job's key names its markers and logs: its id, or <array job id>_<task id> as an element of a job array.
export MULTINODE_JOB_KEY=${MULTINODE_ARRAY_KEY:-$SLURM_JOB_ID}  # the rule may use it: the job as the plugin knows it
unset MULTINODE_ARRAY_KEY
MULTINODE_JOB_NAME=mn-0123abcd-train
# A requeued job (USR2 checkpoint, node failure) writes each restart to its own log beside the first; an array
# element writes its own log (the array's output is one for all of them).
# Each node's labelled output: "$MULTINODE_LOG_STEM".<node>.out.
export MULTINODE_LOG_STEM=.snakemake/multinode/logs/rule_train/_/"$MULTINODE_JOB_KEY".attempt1
[ "${SLURM_RESTART_COUNT:-0}" -eq 0 ] || MULTINODE_LOG_STEM="$MULTINODE_LOG_STEM".restart$SLURM_RESTART_COUNT
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || [ "$MULTINODE_JOB_KEY" != "$SLURM_JOB_ID" ]; then
    exec >>"$MULTINODE_LOG_STEM".log 2>&1
fi
# Times from bash's printf, not date: a fan-out runs this script hundreds of times, and every process counts.
multinode_now() {  # MULTINODE_NOW: the time as `date -Is` writes it
    printf -v MULTINODE_NOW '%(%Y-%m-%dT%H:%M:%S%z)T' -1
    MULTINODE_NOW=${MULTINODE_NOW:0:-2}:${MULTINODE_NOW: -2}
}
printf -v MULTINODE_STARTED '%(%s)T' -1
multinode_now
echo "[multinode] job $MULTINODE_JOB_KEY, rule train, attempt 1, restart ${SLURM_RESTART_COUNT:-0}, $MULTINODE_NOW"

# ==== bookkeeping: a marker on the shared filesystem tells Snakemake the job ended (no slurmctld query)
MULTINODE_STATE_DIR=/work/project/.snakemake/multinode/state
export MULTINODE_PREEMPT_FILE="$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.preempted"
export MULTINODE_FAILED_NODE_FILE="$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.failed-node"
export MULTINODE_STALL_FILE="$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.stalled"
export MULTINODE_METRICS_FILE=/work/project/.snakemake/multinode/logs/rule_train/_/"$MULTINODE_JOB_KEY".attempt1.metrics.jsonl  # training progress: `multinode status` reads its last line
MULTINODE_RUNS_FILE=/work/project/.snakemake/multinode/logs/rule_train/_/"$MULTINODE_JOB_KEY".attempt1.runs.jsonl  # each run's start and end, for the outputs' provenance records
MULTINODE_REQUEUED=0
multinode_finish() {
    local rc=$?
    if [ "$MULTINODE_REQUEUED" = 1 ]; then
        # Said here, as slurmctld's SIGTERM ends the run: that SIGTERM can end this shell before it sees scontrol
        # requeue return, and a line after scontrol would then be lost.
        echo "[multinode] requeued; the next run resumes from the checkpoint"
        return
    fi
    multinode_now
    echo "[multinode] exit $rc, $MULTINODE_NOW"
    printf '{"event": "end", "job": "%s", "restart": %s, "exit": %s, "time": "%s"}\n' \
        "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" "$rc" "$MULTINODE_NOW" >>"$MULTINODE_RUNS_FILE"
    local marker="$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.exit" line
    # atomic (never read half-written); the restart tells a requeued job's earlier runs from its last, the job name
    # (unique to the submission) this job's marker from one of an earlier job with the same id
    printf -v line '%s %s %s\n' "$rc" "${SLURM_RESTART_COUNT:-0}" "$MULTINODE_JOB_NAME"
    if ! { printf '%s' "$line" >"$marker.tmp" && mv -f "$marker.tmp" "$marker"; } 2>/dev/null; then
        # a full disk: said, nothing waits on it (Snakemake learns of the end from SLURM at its next sweep)
        rm -f "$marker.tmp" 2>/dev/null
        echo "[multinode] cannot write the exit marker $marker: ${#line} bytes needed," \
            "$(df -B1 --output=avail "$MULTINODE_STATE_DIR" 2>/dev/null | tail -n 1 | tr -d ' ') bytes free in" \
            "$MULTINODE_STATE_DIR; Snakemake learns of the job's end from SLURM instead"
    fi
}
trap multinode_finish EXIT
trap 'exit 143' TERM
[ -d "$MULTINODE_STATE_DIR" ] || mkdir -p "$MULTINODE_STATE_DIR"
MULTINODE_STALE=("$MULTINODE_PREEMPT_FILE" "$MULTINODE_FAILED_NODE_FILE" "$MULTINODE_STALL_FILE")
# A first run's id is new to this job: exit and requeue markers of that id belong to an earlier job of the same id
[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] ||
    MULTINODE_STALE+=("$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.exit" "$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.requeued" "$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.self-requeues" "$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.crashes")
rm -f "${MULTINODE_STALE[@]}"

# A restart runs the code the job was submitted with; where it could not be frozen, changed code stops it.
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -e /dev/null/none ]; then
    if ! MULTINODE_CHANGED=$(sha256sum --quiet -c /dev/null/none 2>&1); then
        echo "[multinode] not resuming: the code changed since the job was submitted:" $MULTINODE_CHANGED
        echo "[multinode] rerun the job with Snakemake (or keep the code frozen: --multinode-snapshot)"
        exit 86
    fi
fi

# ==== 2. environment =============================================================================
# CUDA: PATH keeps what it had; LD_LIBRARY_PATH and CUDA_HOME are replaced so CUDA versions never mix
export PATH=/path/to/cuda-11.8/bin:"$PATH"
export LD_LIBRARY_PATH=/path/to/cuda-11.8/lib64
export CUDA_HOME=/path/to/cuda-11.8
# conda environment (activated here, so the submitting shell needs none)
source /path/to/anaconda3/etc/profile.d/conda.sh
conda activate my_env
# NCCL / InfiniBand
export NCCL_IB_DISABLE=0
export NCCL_SOCKET_IFNAME='^lo,docker'
export NCCL_IB_HCA=mlx5_0
export NCCL_IB_GID_INDEX=0
export NCCL_IB_TC=106
export NCCL_IB_TIMEOUT=22
export NCCL_NET_GDR_LEVEL=2
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_LAUNCH_MODE=GROUP
export NCCL_MIN_NRINGS=4
export NCCL_DEBUG=WARN
export TORCH_NCCL_TRACE_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$SLURM_SUBMIT_DIR/$MULTINODE_LOG_STEM".nccl-trace-rank  # the dumps, beside the job log
# network preflight: one tiny all-reduce over all ranks before the training (docs/network-preflight.md)
export MULTINODE_NETWORK_CHECK=60
# variables
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

# One experiment across every run of this job (each requeue, restart and Snakemake retry of it): the trackers' run
# id, a TensorBoard folder the same for every run (docs/training-contract.md). After the environment: a profile's
# WANDB_RUN_ID, as anyone's, is never overwritten.
export MULTINODE_RUN_ID=3d2fcffe39aed924 MULTINODE_CODE_DIGEST=''
export MULTINODE_TENSORBOARD_DIR=/work/project/.snakemake/multinode/logs/rule_train/_/tensorboard/3d2fcffe39aed924
if [ -z "${WANDB_RUN_ID+set}" ]; then
    export WANDB_RUN_ID=$MULTINODE_RUN_ID WANDB_RESUME=${WANDB_RESUME-allow}
fi

# ==== 3. nodes and rendezvous (resolved here, on the head node) ==================================
if [ "${SLURM_JOB_NUM_NODES:-}" = 1 ]; then  # one node: its name is the node list (no process for it)
    NODELIST=$SLURM_JOB_NODELIST NODE_NUM=1 MASTER_NODE=$SLURM_JOB_NODELIST
else
    NODELIST=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
    NODE_NUM=$(echo "$NODELIST" | wc -l)
    MASTER_NODE=$(echo "$NODELIST" | head -n 1)
fi
MASTER_ADDR=$(getent ahostsv4 "$MASTER_NODE" | awk 'NR == 1 {print $1}')
case "$MASTER_ADDR" in
    "" | 127.*) MASTER_ADDR=$(hostname -I | awk '{print $1}') ;;  # a loopback entry is unreachable from peers
esac
# Derived from the job id: jobs sharing a head node get different ports unless their ids are a whole cycle apart
# (contract/protocol.py, PORT_CYCLE); the launcher on the head node moves on from a port in use.
MASTER_PORT=$((20000 + SLURM_JOB_ID * 4 % 40000))
export NODELIST NODE_NUM MASTER_ADDR MASTER_PORT
export MULTINODE_NODES=2 MULTINODE_GPUS_PER_NODE=8 MULTINODE_CPUS_PER_TASK=64
export MULTINODE_OMP_NUM_THREADS=8  # CPUs per GPU process, for rules that start their own workers
# The rule's resources that `multinode torchrun` reads (its progress watchdog: seconds without a new line from any
# rank or a metrics line, 0: off; what a stall does).
export MULTINODE_STALL_TIMEOUT=1800 MULTINODE_ON_STALL=fail MULTINODE_ON_STRAGGLER=warn MULTINODE_STRAGGLER_FACTOR=1.5 MULTINODE_STRAGGLER_WINDOW=120
echo "NODE_NUM=$NODE_NUM"
echo "NODELIST: ${NODELIST//$'\n'/ }"
echo "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
# This run's start line: its nodes, and for a job with GPUs or software of its own (an activated environment,
# modules, a container) its GPUs and package versions read there (importlib metadata: no torch import). Any other
# job runs in the submitting side's environment, whose versions the submission record holds: no Python here.
multinode_start_line() {
    local host
    read -r host </proc/sys/kernel/hostname  # not $HOSTNAME: --export=ALL carries the submitting host's
    printf '{"event": "start", "job": "%s", "restart": %s, "nodes": "%s", "train_nodes": %s, "host": "%s", "time": "%(%Y-%m-%dT%H:%M:%S%z)T"}\n' \
        "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" "$SLURM_JOB_NODELIST" "$MULTINODE_NODES" "$host" -1 >>"$MULTINODE_RUNS_FILE"
}
if [ 1 = 1 ]; then
    multinode provenance --start "$MULTINODE_RUNS_FILE" 2>/dev/null || multinode_start_line
else
    multinode_start_line
fi

# GPU samples: every node's GPU utilisation and memory beside the log, for `multinode status` and `multinode report`
# ("$MULTINODE_GPU_SAMPLES".<node>.gpu.csv). A step of its own (--overlap: it takes nothing from the rule's steps), one task per
# node, so that any GPU job is sampled whatever starts its processes; none where the head node has no nvidia-smi.
MULTINODE_GPU_SAMPLER=
if [ 30 -gt 0 ] && command -v nvidia-smi >/dev/null; then
    export MULTINODE_GPU_SAMPLES=/work/project/.snakemake/multinode/logs/rule_train/_/"$MULTINODE_JOB_KEY".attempt1
    srun --overlap --nodes="$NODE_NUM" --ntasks="$NODE_NUM" --ntasks-per-node=1 --cpus-per-task=1 --mem=0 \
        --export=ALL --job-name=gpu-samples bash -c 'command -v nvidia-smi >/dev/null || exit 0; trap "" USR1 USR2; exec nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits -l 30 >>"$MULTINODE_GPU_SAMPLES"."$SLURMD_NODENAME".gpu.csv' >/dev/null 2>&1 &
    MULTINODE_GPU_SAMPLER=$!
fi

# ==== 4. the rule ================================================================================
# Snakemake gives every shell command OMP/BLAS threads = the rule's threads; `multinode torchrun` sets
# OMP_NUM_THREADS = CPUs per GPU for the workers it starts.
export OMP_NUM_THREADS=1 GOTO_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export MKL_NUM_THREADS=1 VECLIB_MAXIMUM_THREADS=1 NUMEXPR_NUM_THREADS=1
cd /work/project
rc=0
# In the background, in a process group of its own, so that a SIGTERM (scancel, time limit, requeue, preemption)
# reaches all of it at once: with proctrack/cgroup SLURM signals only this shell, and a shell runs its TERM trap
# only after its foreground command has ended; the command would hold the job until KillWait's SIGKILL.
set -m
bash -c 'multinode torchrun train.py --data results/data/train.bin --out results/model/final.pt' &
MULTINODE_COMMAND=$!
set +m
trap 'kill -TERM -- -"$MULTINODE_COMMAND" 2>/dev/null; wait "$MULTINODE_COMMAND"; exit 143' TERM
wait "$MULTINODE_COMMAND" || rc=$?
# The samples end with the rule's command (srun stops its tasks on SIGTERM); the job's end would stop them anyway.
[ -z "$MULTINODE_GPU_SAMPLER" ] || { kill "$MULTINODE_GPU_SAMPLER" 2>/dev/null; wait "$MULTINODE_GPU_SAMPLER"; }

# ==== 5. checkpointed before the time limit, or stalled (on_stall requeue)? requeue, to resume ===
if [ -e "$MULTINODE_PREEMPT_FILE" ]; then
    if [ -e "$MULTINODE_STALL_FILE" ]; then  # on_stall: requeue; no signal came, the launcher ended the step
        echo "[multinode] stalled, ended by the progress watchdog (on_stall: requeue): $(cat "$MULTINODE_STALL_FILE")"
    else
        echo "[multinode] checkpointed after SIGUSR2 ($(cat "$MULTINODE_PREEMPT_FILE"))"
    fi
    # The job's own requeues only: SLURM's restart count also counts preemptions and admin requeues, which must not
    # use up the budget (a job preempted 3 times still requeues itself at its time limit).
    MULTINODE_SELF_REQUEUES=$(cat "$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.self-requeues" 2>/dev/null || echo 0)
    # Did a spare replace a node in this job? The node events' one reader answers (0 yes, 1 no, else unknown); a
    # takeover the launcher could not record is its exit code. Unknown takes the safe path: no requeue of its own.
    MULTINODE_REPLACED=0
    if [ "$rc" -eq 89 ]; then
        MULTINODE_REPLACED=1
    elif [ -e .snakemake/multinode/logs/rule_train/_/"$MULTINODE_JOB_KEY".attempt1.replacements.jsonl ]; then
        multinode node-events --replaced .snakemake/multinode/logs/rule_train/_/"$MULTINODE_JOB_KEY".attempt1.replacements.jsonl && MULTINODE_REPLACED=1 || MULTINODE_REPLACED=$(($? != 1))
    fi
    if [ "$MULTINODE_REPLACED" = 1 ]; then
        # SLURM 22.05 cannot start a step in a job with spares requeued after it lost a node ("Invalid generic
        # resource (gres) specification"), and a requeue could not leave the replaced nodes out: the retry can
        echo "[multinode] not requeued by itself: a spare replaced a node in this job, or its record is unknown" \
            "(multinode status names it)"
    elif [ "$MULTINODE_SELF_REQUEUES" -lt 3 ]; then  # at most 3 requeue(s) of its own
        MULTINODE_REQUEUED=1
        rm -f "$MULTINODE_PREEMPT_FILE"
        echo "$((MULTINODE_SELF_REQUEUES + 1))" >"$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.self-requeues"
        MULTINODE_WHY="checkpointed before the time limit"
        [ -e "$MULTINODE_STALL_FILE" ] && MULTINODE_WHY="stalled: ended by the progress watchdog, on_stall requeue"
        printf '%s %s\n' "$((${SLURM_RESTART_COUNT:-0} + 1))" "$MULTINODE_WHY" >"$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.requeued"
        if scontrol requeue "$SLURM_JOB_ID"; then
            sleep 600 & wait  # slurmctld ends this run (the EXIT trap says so)
        fi
        MULTINODE_REQUEUED=0
    fi
    echo "[multinode] not requeued: a rerun or --retries resumes from the checkpoint"
    exit 85
fi

# ==== 6. a crash loop ends here ==================================================================================
# SLURM runs some failed jobs again (a site's RequeueExit, a node failure). 3 failures in a row,
# each within 300 s of its start, end the job with an exit code no RequeueExit names. SLURM's
# SIGTERM (143: preemption, admin requeue, scancel) is no failure of the job's: it neither counts nor breaks a streak.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 143 ] && [ 3 -gt 0 ]; then
    MULTINODE_CRASHES=0
    printf -v MULTINODE_ENDED '%(%s)T' -1
    if [ $((MULTINODE_ENDED - MULTINODE_STARTED)) -lt 300 ]; then
        MULTINODE_CRASHES=$(($(cut -d ' ' -f 1 "$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.crashes" 2>/dev/null || echo 0) + 1))
    fi
    echo "$MULTINODE_CRASHES $rc" >"$MULTINODE_STATE_DIR/$MULTINODE_JOB_KEY.crashes"
    if [ "$MULTINODE_CRASHES" -ge 3 ]; then
        echo "[multinode] crash loop: $MULTINODE_CRASHES runs in a row failed within 300 s of their" \
            "start, the last with exit $rc; not run again"
        exit 88
    fi
fi
exit "$rc"
