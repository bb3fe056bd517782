"""In-job restarts (resource max_restarts): a training whose rank crashed, or whose step the stall watchdog ended, on
nodes that still answer is started again in the same SLURM job, on the same nodes: a new srun step (the launcher's
relaunch loop, launcher.launch_with_spares), after the node check passed on every node again. The training resumes
from its own last checkpoint, told which launch it is by $MULTINODE_RELAUNCH. No requeue, no new job.

Two rules stop it, checked after each failed launch:
- the budget: at most `max_restarts` restarts in one run of the job (0: none, the failure ends the job as before);
- a crash loop: `crash_loop_runs` failed launches in a row (--multinode-crash-loop-runs, as for the job script's own
  crash loop across SLURM requeues) without progress: none of them logged a step line beyond the highest step the
  first of them reached. A launch that logged no step line made no progress (a training that writes no metrics
  lines is stopped by this rule after that many failures in a row).
A dead node (it does not answer) is no case for a restart: a spare takes its place, or the job fails naming it for
the retry to exclude, as before; so is a node that fails its node check before the restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from snakemake_executor_multinode.contract import protocol


@dataclass(frozen=True)
class Budget:
    """The job's restart settings, from the job script's variables; unset or not a number (a hand-written sbatch
    script): 0, no restarts and no crash-loop rule, the launcher as before."""

    max_restarts: int = 0
    crash_loop_runs: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Budget:
        return cls(_count(env.get(protocol.MAX_RESTARTS_VAR, "")), _count(env.get(protocol.CRASH_LOOP_RUNS_VAR, "")))


def _count(text: str) -> int:
    return int(text) if text.isdigit() else 0


def crash_loop(reached: Sequence[float | None], runs: int) -> bool:
    """Whether the last `runs` failed launches (each one's highest step, None for none) made no progress: none got
    beyond the step the first of them reached. Fewer failed launches than `runs`, or `runs` 0: no loop."""
    if runs <= 0 or len(reached) < runs:
        return False
    last = [-1.0 if step is None else step for step in reached[-runs:]]
    return max(last) <= last[0]


def why_not(budget: Budget, restarts: int, reached: Sequence[float | None]) -> str | None:
    """None when a failed launch is to be restarted; else why not, as the log and the stall's verdict say it.
    `restarts`: the restarts this run of the job made so far; `reached`: each failed launch's highest step, in
    order, the one that just failed last."""
    if budget.max_restarts <= 0:
        return "max_restarts is 0"
    if restarts >= budget.max_restarts:
        return f"its restarts are used up ({restarts} of max_restarts {budget.max_restarts})"
    if crash_loop(reached, budget.crash_loop_runs):
        runs = budget.crash_loop_runs
        first = reached[-runs]
        where = "before any step line" if first is None else f"none beyond step {first:g}"
        return f"a crash loop: {runs} launches in a row failed without progress ({where})"
    return None
