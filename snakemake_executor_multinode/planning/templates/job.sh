#!/bin/bash
# {{title}}
# Written by snakemake-executor-plugin-multinode; `multinode preview` prints the same script.
# Code: {{code}}
# ==== 1. resources ===============================================================================
{{sbatch}}

# The job's key names its markers and logs: its id, or <array job id>_<task id> as an element of a job array.
export MULTINODE_JOB_KEY=${MULTINODE_ARRAY_KEY:-$SLURM_JOB_ID}  # the rule may use it: the job as the plugin knows it
unset MULTINODE_ARRAY_KEY
MULTINODE_JOB_NAME={{job_name}}
# A requeued job (USR2 checkpoint, node failure) writes each restart to its own log beside the first; an array
# element writes its own log (the array's output is one for all of them).
# Each node's labelled output: {{node_out}}.
export MULTINODE_LOG_STEM={{log_stem}}
[ "${SLURM_RESTART_COUNT:-0}" -eq 0 ] || MULTINODE_LOG_STEM="$MULTINODE_LOG_STEM"{{restart_suffix}}
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || [ "$MULTINODE_JOB_KEY" != "$SLURM_JOB_ID" ]; then
    exec >>{{this_log}} 2>&1
fi
# Times from bash's printf, not date: a fan-out runs this script hundreds of times, and every process counts.
multinode_now() {  # MULTINODE_NOW: the time as `date -Is` writes it
    printf -v MULTINODE_NOW '%(%Y-%m-%dT%H:%M:%S%z)T' -1
    MULTINODE_NOW=${MULTINODE_NOW:0:-2}:${MULTINODE_NOW: -2}
}
printf -v MULTINODE_STARTED '%(%s)T' -1
multinode_now
echo "[multinode] job $MULTINODE_JOB_KEY, rule {{rule_q}}, attempt {{attempt}}, restart ${SLURM_RESTART_COUNT:-0}, $MULTINODE_NOW"

# ==== bookkeeping: a marker on the shared filesystem tells Snakemake the job ended (no slurmctld query)
MULTINODE_STATE_DIR={{state_dir}}
export MULTINODE_PREEMPT_FILE={{preempt_marker}}
export MULTINODE_FAILED_NODE_FILE={{failed_node_marker}}
export MULTINODE_STALL_FILE={{stall_marker}}
export MULTINODE_METRICS_FILE={{metrics_file}}  # training progress: `multinode status` reads its last line
MULTINODE_RUNS_FILE={{runs_file}}  # each run's start and end, for the outputs' provenance records
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
    local marker={{exit_marker}} line
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
    MULTINODE_STALE+=({{exit_marker}} {{requeue_marker}} {{self_requeue_marker}} {{crash_marker}})
rm -f "${MULTINODE_STALE[@]}"

# A restart runs the code the job was submitted with; where it could not be frozen, changed code stops it.
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -e {{code_manifest}} ]; then
    if ! MULTINODE_CHANGED=$(sha256sum --quiet -c {{code_manifest}} 2>&1); then
        echo "[multinode] not resuming: the code changed since the job was submitted:" $MULTINODE_CHANGED
        echo "[multinode] rerun the job with Snakemake (or keep the code frozen: --multinode-snapshot)"
        exit {{exit_code_changed}}
    fi
fi

# ==== 2. environment =============================================================================
{{environment}}

# One experiment across every run of this job (each requeue, restart and Snakemake retry of it): the trackers' run
# id, a TensorBoard folder the same for every run (docs/training-contract.md). After the environment: a profile's
# WANDB_RUN_ID, as anyone's, is never overwritten.
export MULTINODE_RUN_ID={{run_id}} MULTINODE_CODE_DIGEST={{code_digest}}
export MULTINODE_TENSORBOARD_DIR={{tensorboard_dir}}
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
MASTER_PORT={{master_port}}
export NODELIST NODE_NUM MASTER_ADDR MASTER_PORT
export MULTINODE_NODES={{nodes}} MULTINODE_GPUS_PER_NODE={{gpus}} MULTINODE_CPUS_PER_TASK={{cpus_per_task}}
export MULTINODE_OMP_NUM_THREADS={{omp_threads}}  # CPUs per GPU process, for rules that start their own workers
# The rule's resources that `multinode torchrun` reads (its progress watchdog: seconds without a new line from any
# rank or a metrics line, 0: off; what a stall does).
{{launcher_variables}}
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
if [ {{versions_in_job}} = 1 ]; then
    multinode provenance --start "$MULTINODE_RUNS_FILE" 2>/dev/null || multinode_start_line
else
    multinode_start_line
fi

# GPU samples: every node's GPU utilisation and memory beside the log, for `multinode status` and `multinode report`
# ({{gpu_samples_file}}). A step of its own (--overlap: it takes nothing from the rule's steps), one task per
# node, so that any GPU job is sampled whatever starts its processes; none where the head node has no nvidia-smi.
MULTINODE_GPU_SAMPLER=
if [ {{gpu_sample_seconds}} -gt 0 ] && command -v nvidia-smi >/dev/null; then
    export MULTINODE_GPU_SAMPLES={{gpu_samples}}
    srun --overlap --nodes="$NODE_NUM" --ntasks="$NODE_NUM" --ntasks-per-node=1 --cpus-per-task=1 --mem=0 \
        --export=ALL --job-name=gpu-samples bash -c {{gpu_sampler}} >/dev/null 2>&1 &
    MULTINODE_GPU_SAMPLER=$!
fi

# ==== 4. the rule ================================================================================
# Snakemake gives every shell command OMP/BLAS threads = the rule's threads; `multinode torchrun` sets
# OMP_NUM_THREADS = CPUs per GPU for the workers it starts.
export OMP_NUM_THREADS={{threads}} GOTO_NUM_THREADS={{threads}} OPENBLAS_NUM_THREADS={{threads}}
export MKL_NUM_THREADS={{threads}} VECLIB_MAXIMUM_THREADS={{threads}} NUMEXPR_NUM_THREADS={{threads}}
cd {{workdir}}
rc=0
# In the background, in a process group of its own, so that a SIGTERM (scancel, time limit, requeue, preemption)
# reaches all of it at once: with proctrack/cgroup SLURM signals only this shell, and a shell runs its TERM trap
# only after its foreground command has ended; the command would hold the job until KillWait's SIGKILL.
set -m
{{command}} &
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
        echo "[multinode] {{checkpointed}} ($(cat "$MULTINODE_PREEMPT_FILE"))"
    fi
    # The job's own requeues only: SLURM's restart count also counts preemptions and admin requeues, which must not
    # use up the budget (a job preempted 3 times still requeues itself at its time limit).
    MULTINODE_SELF_REQUEUES=$(cat {{self_requeue_marker}} 2>/dev/null || echo 0)
    # Did a spare replace a node in this job? The node events' one reader answers (0 yes, 1 no, else unknown); a
    # takeover the launcher could not record is its exit code. Unknown takes the safe path: no requeue of its own.
    MULTINODE_REPLACED=0
    if [ "$rc" -eq {{exit_unrecorded}} ]; then
        MULTINODE_REPLACED=1
    elif [ -e {{replacements_file}} ]; then
        multinode node-events --replaced {{replacements_file}} && MULTINODE_REPLACED=1 || MULTINODE_REPLACED=$(($? != 1))
    fi
    if [ "$MULTINODE_REPLACED" = 1 ]; then
        # SLURM 22.05 cannot start a step in a job with spares requeued after it lost a node ("Invalid generic
        # resource (gres) specification"), and a requeue could not leave the replaced nodes out: the retry can
        echo "[multinode] not requeued by itself: a spare replaced a node in this job, or its record is unknown" \
            "(multinode status names it)"
    elif [ "$MULTINODE_SELF_REQUEUES" -lt {{max_requeues}} ]; then  # at most {{max_requeues}} requeue(s) of its own
        MULTINODE_REQUEUED=1
        rm -f "$MULTINODE_PREEMPT_FILE"
        echo "$((MULTINODE_SELF_REQUEUES + 1))" >{{self_requeue_marker}}
        MULTINODE_WHY="checkpointed before the time limit"
        [ -e "$MULTINODE_STALL_FILE" ] && MULTINODE_WHY="stalled: ended by the progress watchdog, on_stall requeue"
        printf '%s %s\n' "$((${SLURM_RESTART_COUNT:-0} + 1))" "$MULTINODE_WHY" >{{requeue_marker}}
        if scontrol requeue "$SLURM_JOB_ID"; then
            sleep 600 & wait  # slurmctld ends this run (the EXIT trap says so)
        fi
        MULTINODE_REQUEUED=0
    fi
    echo "[multinode] not requeued: a rerun or --retries resumes from the checkpoint"
    exit {{exit_preempted}}
fi

# ==== 6. a crash loop ends here ==================================================================================
# SLURM runs some failed jobs again (a site's RequeueExit, a node failure). {{crash_loop_runs}} failures in a row,
# each within {{crash_loop_seconds}} s of its start, end the job with an exit code no RequeueExit names. SLURM's
# SIGTERM (143: preemption, admin requeue, scancel) is no failure of the job's: it neither counts nor breaks a streak.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 143 ] && [ {{crash_loop_runs}} -gt 0 ]; then
    MULTINODE_CRASHES=0
    printf -v MULTINODE_ENDED '%(%s)T' -1
    if [ $((MULTINODE_ENDED - MULTINODE_STARTED)) -lt {{crash_loop_seconds}} ]; then
        MULTINODE_CRASHES=$(($(cut -d ' ' -f 1 {{crash_marker}} 2>/dev/null || echo 0) + 1))
    fi
    echo "$MULTINODE_CRASHES $rc" >{{crash_marker}}
    if [ "$MULTINODE_CRASHES" -ge {{crash_loop_runs}} ]; then
        echo "[multinode] crash loop: $MULTINODE_CRASHES runs in a row failed within {{crash_loop_seconds}} s of their" \
            "start, the last with exit $rc; not run again"
        exit {{exit_crash_loop}}
    fi
fi
exit "$rc"
