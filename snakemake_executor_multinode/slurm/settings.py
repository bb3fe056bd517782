"""How jobs go to SLURM, as settings (`--multinode-<name>`): sbatch pacing, retries of transient failures, job
arrays. Declared by the stage that submits; session.py, which paces the client with them, composes them into the
plugin's `Settings`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SubmitSettings:
    """The settings of submission to SLURM; session.py checks their bounds when a run starts."""

    submit_rate: float = field(
        default=10.0,
        metadata={
            "help": "At most this many sbatch calls per second, after a first burst of --multinode-submit-burst: a "
            "fan-out reaches slurmctld as a stream (refusals for rate or load are retried with backoff, never "
            "submitting a job twice)."
        },
    )
    submit_burst: int = field(
        default=30, metadata={"help": "sbatch calls allowed at once before --multinode-submit-rate paces them."}
    )
    no_arrays: bool = field(
        default=False,
        metadata={
            "help": "Submit every job on its own. By default single-node jobs of one rule that Snakemake hands over "
            "together and that ask SLURM for the same go as one job array (one submission; each element keeps its "
            "own log, markers and record)."
        },
    )
    slurm_retry_seconds: float = field(
        default=600.0,
        metadata={
            "help": "How long sbatch/squeue/sacct/scancel failures that SLURM reports as transient (controller "
            "restarting, timeouts) are retried, with backoff, before the run gives up."
        },
    )
