"""The contract between the job script, `multinode torchrun`, the training and the job status watch, said once.

The job script (templates/job.sh) receives the marker paths, the exit code and the port rule from here as
placeholders; the launcher and the job status watch import them; the training reads the MULTINODE_* variables by name
(`tests/process/contract/test_protocol.py` proves that the template, the launcher and the example training agree).
"""

from __future__ import annotations

# Exit code of a job whose training checkpointed on the pre-time-limit signal and was not requeued: a rerun (or
# Snakemake's --retries) resumes from the checkpoint. Chosen outside the shell's 126+ and signal ranges.
EXIT_PREEMPTED = 85

# Exit code of a restart (requeue, preemption) whose code changed since submission while nothing was frozen
# (--multinode-snapshot off, or no git): it stops rather than resume a checkpoint with other code.
EXIT_CODE_CHANGED = 86
# Exit code of `multinode torchrun` (and so of the job) whose step the progress watchdog ended (on_stall: fail).
EXIT_STALLED = 87
# Exit code of a job whose runs failed soon after their start several times in a row (a crash loop; the job script
# ends it so that nothing requeues it again: --multinode-crash-loop-runs).
EXIT_CRASH_LOOP = 88
# Exit code of `multinode torchrun` whose training checkpointed after a spare took a node's place, when the job's node
# events could not record that (a full disk): the job script then does not requeue itself, as it would not with the
# record (contract/node_events.py); the retry resumes.
EXIT_UNRECORDED = 89
# Exit code of a node's network preflight (launching/network_check.py) that failed, or stopped because another node did:
# the node is at fault, not the training, so `multinode torchrun` does not restart the training on it (the failed-node
# marker names it for the retry to exclude).
EXIT_PREFLIGHT = 90

# GPU samples of a job with GPUs, one file per node beside the job's first log (every run of a requeued job appends
# to it): nvidia-smi's CSV lines of GPU_QUERY (no header, no units: MiB and %), one line per GPU every
# --multinode-gpu-sample-seconds. `multinode status` and `multinode report` read them (watching/gpu_use.py).
GPU_QUERY = ("timestamp", "index", "utilization.gpu", "memory.used", "memory.total")


def gpu_sampler(seconds: int) -> list[str]:
    """The sampler each node runs: one CSV line per GPU every `seconds`, until it is stopped."""
    return [
        "nvidia-smi",
        f"--query-gpu={','.join(GPU_QUERY)}",
        "--format=csv,noheader,nounits",
        "-l",
        str(seconds),
    ]


# Variables the job script exports for the launcher and the training.
STATE_DIR_VAR = "MULTINODE_STATE_DIR"
# The job's key, which names its markers and logs: $SLURM_JOB_ID, or <array job id>_<task id> for an element of a
# job array (the array's script hands it over in ARRAY_KEY_VAR, and the element's script unsets that). Exported: the
# rule's command sees the job as the registry, `multinode status` and Snakemake's log name it.
JOB_KEY_VAR = "MULTINODE_JOB_KEY"
ARRAY_KEY_VAR = "MULTINODE_ARRAY_KEY"
JOB_NAME_VAR = "MULTINODE_JOB_NAME"  # internal to the job script: the submission's name, written into the exit marker
PREEMPT_FILE_VAR = "MULTINODE_PREEMPT_FILE"  # training: write your step here after checkpointing on SIGUSR2
# SLURM's preemption notice of this run (jobfiles.PREEMPT_NOTICE_MARKER): `multinode torchrun`'s labellers write it
# when SLURM's SIGTERM comes with a PreemptTime (launching/preemption.py), the job script and the launcher read it.
PREEMPT_NOTICE_FILE_VAR = "MULTINODE_PREEMPT_NOTICE_FILE"
# `multinode cancel --checkpoint` (or Snakemake's first Ctrl-C) asks the job's training to checkpoint before its end
# (jobfiles.CANCEL_MARKER): a SIGTERM to the training's step is then passed on as the checkpoint signal, and the job
# script ends the job after the checkpoint instead of requeueing it.
CANCEL_FILE_VAR = "MULTINODE_CANCEL_FILE"
# The name of the signal the rule's training checkpoints on (its `signal`, USR2 by default): `multinode torchrun`
# passes SLURM's preemption SIGTERM on to the workers as this signal.
CHECKPOINT_SIGNAL_VAR = "MULTINODE_CHECKPOINT_SIGNAL"
FAILED_NODE_FILE_VAR = "MULTINODE_FAILED_NODE_FILE"
STALL_FILE_VAR = "MULTINODE_STALL_FILE"  # the progress watchdog's verdict (launching/stall.py)
NODES_VAR = "MULTINODE_NODES"
GPUS_PER_NODE_VAR = "MULTINODE_GPUS_PER_NODE"
CPUS_PER_TASK_VAR = "MULTINODE_CPUS_PER_TASK"
OMP_THREADS_VAR = "MULTINODE_OMP_NUM_THREADS"  # CPUs per GPU process, for rules that start their own workers
SELF_REQUEUES_VAR = "MULTINODE_SELF_REQUEUES"  # internal to the job script: its own requeues so far
STARTED_VAR = "MULTINODE_STARTED"  # internal to the job script: this run's start (epoch seconds)
CRASHES_VAR = "MULTINODE_CRASHES"  # internal to the job script: quick failures in a row, this run's included
ENDED_VAR = "MULTINODE_ENDED"  # internal to the job script: this run's end (epoch seconds)
ENDED_WELL_VAR = "MULTINODE_ENDED_WELL"  # internal to the job script: the previous run's end line, had it ended well
NOW_VAR = "MULTINODE_NOW"  # internal to the job script: the time, as `date -Is` writes it
STALE_VAR = "MULTINODE_STALE"  # internal to the job script: markers a new run removes
REQUEUED_VAR = "MULTINODE_REQUEUED"  # internal to the job script: this run handed over to its requeued rerun
REPLACED_VAR = "MULTINODE_REPLACED"  # internal to the job script: a spare replaced a node (or unknown): no requeue
REQUEUE_WHY_VAR = "MULTINODE_WHY"  # internal to the job script: why it requeues itself (the requeue marker's text)
COMMAND_VAR = "MULTINODE_COMMAND"  # internal to the job script: the rule's command (its process group's id)
# The launcher's watchdog: seconds without progress; "auto": the training's own pace (launching/stall.py,
# adaptive_timeout: the default); 0 or unset: off.
STALL_TIMEOUT_VAR = "MULTINODE_STALL_TIMEOUT"
STALL_AUTO = "auto"
ON_STALL_VAR = "MULTINODE_ON_STALL"  # fail | requeue: what a stall does once no restart is left
# In-job restarts (launching/restarts.py): how many times a crashed or stalled training starts again on the same
# nodes in one run of the job, and how many failed launches in a row without progress make a crash loop that ends
# them (--multinode-crash-loop-runs); unset: 0, none.
MAX_RESTARTS_VAR = "MULTINODE_MAX_RESTARTS"
CRASH_LOOP_RUNS_VAR = "MULTINODE_CRASH_LOOP_RUNS"
# The launcher's straggler check (launching/straggler.py): what a named straggler does (warn | replace), how many
# times slower than the other nodes' median a node's ranks must be, and for how many seconds in a row.
ON_STRAGGLER_VAR = "MULTINODE_ON_STRAGGLER"
STRAGGLER_FACTOR_VAR = "MULTINODE_STRAGGLER_FACTOR"
STRAGGLER_WINDOW_VAR = "MULTINODE_STRAGGLER_WINDOW"
# The nodes `multinode torchrun` trains on when the job has spare nodes (resource spare_nodes): the first this many of
# the allocation's nodes not known bad; unset: all of them.
TRAIN_NODES_VAR = "MULTINODE_TRAIN_NODES"
# Training: which launch of the training this is within one run of the job: 0 the first, K after the K-th relaunch
# (a spare replaced a failed node, or an in-job restart on the same nodes; resume from your checkpoint;
# docs/training-contract.md).
RELAUNCH_VAR = "MULTINODE_RELAUNCH"
# Where each run's start and end are recorded (the job script), and a preemption notice (the labeller that got it)
RUNS_FILE_VAR = "MULTINODE_RUNS_FILE"
CHANGED_VAR = "MULTINODE_CHANGED"  # internal to the job script: the files a restart found changed
# Training: write your metrics JSON lines here, or make this path a link to your own metrics file. It lies beside
# the job's log (so it outlives the run), and `multinode status` and the progress lines read its last line.
METRICS_FILE_VAR = "MULTINODE_METRICS_FILE"
# One experiment across every run of a job (the first, each requeue and SLURM restart, each relaunch, every Snakemake
# retry of the same outputs in one Snakemake run): the same id, derived from the submission (planning/plan.py,
# tracking_id) and named in its provenance record. A new Snakemake run (`-F`, or a rerun) is a new experiment.
RUN_ID_VAR = "MULTINODE_RUN_ID"
# The TensorBoard folder of the experiment: the same for every run of it (beside the job's logs, named by the run
# id: jobfiles.tensorboard_dir), so its curves continue across requeues.
TENSORBOARD_DIR_VAR = "MULTINODE_TENSORBOARD_DIR"
# The snapshot the job's code was frozen in (its digest's first 12 characters; "" when nothing was frozen): a tag.
CODE_DIGEST_VAR = "MULTINODE_CODE_DIGEST"
# Weights & Biases resumes a run by these (wandb.init reads them): the job sets them to the run id and "allow" where
# the user has not set WANDB_RUN_ID (a user's value, even an empty one, is passed through untouched).
WANDB_RUN_ID_VAR = "WANDB_RUN_ID"
WANDB_RESUME_VAR = "WANDB_RESUME"
# The tag MLflow finds the experiment's run by (MLflow has no variable to resume a run by name: training/tracking.py
# finds or creates the run with this tag).
MLFLOW_RUN_TAG = "multinode.run_id"
# The job log's path without ".log" (a requeued run's own log included): `multinode torchrun` keeps each node's
# labelled output in <stem>.<node>.out beside it (.out: the job's own logs are the .log files). Unset (a
# hand-written sbatch script): slurm-<jobid> in the submit folder, sbatch's own default.
LOG_STEM_VAR = "MULTINODE_LOG_STEM"
# The job's GPU samples without their <node>.gpu.csv (the first log's stem, absolute): the job script's sampler step
# reads it on every node.
GPU_SAMPLES_VAR = "MULTINODE_GPU_SAMPLES"
GPU_SAMPLER_VAR = "MULTINODE_GPU_SAMPLER"  # internal to the job script: the sampler step's srun (its pid)
# The container each node's torchrun runs in (container_spec.py; the job script exports them from the profile's
# `container:` key, a hand-written sbatch script may set them). Lists are space-separated words.
CONTAINER_RUNTIME_VAR = "MULTINODE_CONTAINER_RUNTIME"  # pyxis | apptainer | singularity | podman; unset: none
CONTAINER_IMAGE_VAR = "MULTINODE_CONTAINER_IMAGE"
CONTAINER_MOUNTS_VAR = "MULTINODE_CONTAINER_MOUNTS"  # SRC[:DST[:ro|rw]] ...
CONTAINER_FLAGS_VAR = "MULTINODE_CONTAINER_FLAGS"  # the runtime's extra options, as shell words
CONTAINER_WORKDIR_VAR = "MULTINODE_CONTAINER_WORKDIR"  # default: the job's working directory
CONTAINER_PYTHON_VAR = "MULTINODE_CONTAINER_PYTHON"  # the image's interpreter (default python3)
CONTAINER_GPUS_VAR = "MULTINODE_CONTAINER_GPUS"  # auto | cdi | devices | none
CONTAINER_ENV_VAR = "MULTINODE_CONTAINER_ENV"  # podman: more variables (NAME or PREFIX*) passed in by name
# Set by the environment section (environment.py, from the profile), not by the template itself.
CONTAINER_VARIABLES = (
    CONTAINER_RUNTIME_VAR,
    CONTAINER_IMAGE_VAR,
    CONTAINER_MOUNTS_VAR,
    CONTAINER_FLAGS_VAR,
    CONTAINER_WORKDIR_VAR,
    CONTAINER_PYTHON_VAR,
    CONTAINER_GPUS_VAR,
    CONTAINER_ENV_VAR,
)
# The network preflight (network_check.py): its limit in seconds; 0 or unset: no check. The job script exports it from
# the profile's `network_check:` key (environment.py); a hand-written sbatch script may set it.
NETWORK_CHECK_VAR = "MULTINODE_NETWORK_CHECK"
NETWORK_CHECK_DEFAULT_S = 60
NETWORK_CHECK_VARIABLES = (NETWORK_CHECK_VAR,)  # set by the environment section, not by the template itself
# The node check (node_check.py): on every node before each launch of the training, its GPUs visible and the site's
# own command passing. The job script exports them from the profile's `node_check:` key (environment.py); unset: on,
# GPUs only, with the default limit (a hand-written sbatch script gets the same check).
NODE_CHECK_VAR = "MULTINODE_NODE_CHECK"  # 1: on, 0: off
NODE_CHECK_COMMAND_VAR = "MULTINODE_NODE_CHECK_COMMAND"  # the site's command, run by bash on every node; "": none
NODE_CHECK_TIMEOUT_VAR = "MULTINODE_NODE_CHECK_TIMEOUT"  # seconds for one node's whole check
NODE_CHECK_DEFAULT_S = 120
NODE_CHECK_VARIABLES = (NODE_CHECK_VAR, NODE_CHECK_COMMAND_VAR, NODE_CHECK_TIMEOUT_VAR)  # the environment section's
# The rule's resources that `multinode torchrun` reads: set from the request (JobRequest.launcher_variables), not by
# the template itself.
LAUNCHER_VARIABLES = (
    STALL_TIMEOUT_VAR,
    ON_STALL_VAR,
    MAX_RESTARTS_VAR,
    CRASH_LOOP_RUNS_VAR,
    TRAIN_NODES_VAR,
    ON_STRAGGLER_VAR,
    STRAGGLER_FACTOR_VAR,
    STRAGGLER_WINDOW_VAR,
)
# Set by `multinode torchrun` for the training (each launch of its step), not by the template.
TRAINING_VARIABLES = (RELAUNCH_VAR,)
VARIABLES = (
    STATE_DIR_VAR,
    JOB_KEY_VAR,
    ARRAY_KEY_VAR,
    JOB_NAME_VAR,
    PREEMPT_FILE_VAR,
    PREEMPT_NOTICE_FILE_VAR,
    CHECKPOINT_SIGNAL_VAR,
    CANCEL_FILE_VAR,
    FAILED_NODE_FILE_VAR,
    STALL_FILE_VAR,
    NODES_VAR,
    GPUS_PER_NODE_VAR,
    CPUS_PER_TASK_VAR,
    OMP_THREADS_VAR,
    REQUEUED_VAR,
    REQUEUE_WHY_VAR,
    REPLACED_VAR,
    SELF_REQUEUES_VAR,
    STARTED_VAR,
    CRASHES_VAR,
    ENDED_VAR,
    ENDED_WELL_VAR,
    NOW_VAR,
    STALE_VAR,
    COMMAND_VAR,
    RUNS_FILE_VAR,
    *LAUNCHER_VARIABLES,
    *TRAINING_VARIABLES,
    CHANGED_VAR,
    METRICS_FILE_VAR,
    RUN_ID_VAR,
    TENSORBOARD_DIR_VAR,
    CODE_DIGEST_VAR,
    LOG_STEM_VAR,
    GPU_SAMPLES_VAR,
    GPU_SAMPLER_VAR,
    *CONTAINER_VARIABLES,
    *NETWORK_CHECK_VARIABLES,
    *NODE_CHECK_VARIABLES,
)

# Rendezvous port: derived from the job id, so jobs sharing a head node pick different ports without talking to each
# other, as long as their ids are less than PORT_CYCLE apart: the rule repeats every PORT_CYCLE ids, and the launcher
# on the head node moves on from a port in use (allocation.free_port). A few ports per job leave room for
# consecutive srun steps of one allocation (a port in TIME_WAIT).
PORT_BASE = 20000
PORT_SPAN = 40000
PORTS_PER_JOB = 4
PORT_CYCLE = PORT_SPAN // PORTS_PER_JOB  # job ids this far apart share their ports


def master_port(job_id: int, step_id: int = 0) -> int:
    return PORT_BASE + (job_id * PORTS_PER_JOB + step_id % PORTS_PER_JOB) % PORT_SPAN


# The network preflight's rendezvous port: a range of its own above the training's, so it never takes the training's
# port (nor a TIME_WAIT left on it), derived from the training's port so that jobs sharing a head node differ. The
# launcher, on the head node, moves on from a busy one (launch.free_port).
NETCHECK_PORT_BASE = PORT_BASE + PORT_SPAN
NETCHECK_PORT_SPAN = 5000


def network_check_port(master_port: int) -> int:
    return NETCHECK_PORT_BASE + (master_port - PORT_BASE) % NETCHECK_PORT_SPAN


def master_port_shell(job_id_var: str = "SLURM_JOB_ID") -> str:
    """The same rule (step 0) as a bash arithmetic expression, for the job script."""
    return f"$(({PORT_BASE} + {job_id_var} * {PORTS_PER_JOB} % {PORT_SPAN}))"


def record_failed_node(path: str, node: str) -> str | None:
    """Name the node to blame in the job's failed-node file (path ""; none), once: the first failure in a job wins
    (the network check's, or an earlier launch's), later ones leave it. The file decides the retry's exclusion, so
    a write that fails is returned as the message to say (None: named, or named already)."""
    if not path:
        return None
    try:
        with open(path, "x") as fh:
            fh.write(f"{node}\n")
    except FileExistsError:
        return None
    except OSError as err:
        return (
            f"cannot name node {node} in the failed-node marker {path} ({err.strerror or err}): a retry of this job "
            f"may land on {node} again"
        )
    return None
