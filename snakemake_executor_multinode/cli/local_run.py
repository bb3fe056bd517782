"""`multinode torchrun` outside SLURM, the way to debug a training before it goes to a cluster: a one-node torchrun
given what a job gives the training, where that makes sense on one machine.

Set, as the job script sets them:
- the environment profile's `nccl:` block and `env:` variables over the defaults every job gets; the profile is
  chosen by the plugin settings' own variables, SNAKEMAKE_MULTINODE_ENV_PROFILE (e.g. `ethernet` or
  `infiniband,debug`) and SNAKEMAKE_MULTINODE_PROFILE_FILE (else that file's `default:`; neither: no profile);
- MULTINODE_METRICS_FILE and MULTINODE_PREEMPT_FILE, and MULTINODE_LOG_STEM (every labelled line also goes into
  <stem>.<host>.out, and NCCL's flight recorder dumps beside it), all under .snakemake/multinode/torchrun/ with a stem
  of the run's own, local-<time>-<pid>.
Not here (`NOT_HERE` says it at the start): what selects the software (modules, CUDA, conda, venv, setup lines, a
container: activate them in your shell first), the network preflight (one node), the node check, the stall watchdog,
the GPU sampler, the requeue and the code snapshot. A training that checkpointed on SIGUSR2 (send it to this
process: it reaches the workers) ends the run with exit 85, as the launcher ends a job's, where the job would requeue.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.jobfiles import JobFiles, StateFolders
from snakemake_executor_multinode.launching import launcher
from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.watching import progress

# The plugin settings' variables (SNAKEMAKE_MULTINODE_<NAME>, planning/settings.py), read by Snakemake for a run and
# here for a run outside SLURM: one export chooses the profile for both.
ENV_PROFILE_VAR = "SNAKEMAKE_MULTINODE_ENV_PROFILE"
PROFILE_FILE_VAR = "SNAKEMAKE_MULTINODE_PROFILE_FILE"
# The profile keys that select software, which a running Python cannot apply to itself.
SOFTWARE = ("modules", "cuda", "conda", "venv", "setup", "container")
NOT_HERE = (
    "the network preflight (one node), the node check, the stall watchdog, the GPU sampler, the requeue "
    "(exit 85 says the training checkpointed on the signal) and the code snapshot run only in a job"
)


@dataclass(frozen=True)
class LocalRun:
    """A run outside SLURM: its files, the variables it adds to the environment, and what it says of them."""

    files: JobFiles
    variables: dict[str, str]
    said: tuple[str, ...]


def stem(now: float, pid: int) -> str:
    return time.strftime("local-%Y%m%d-%H%M%S", time.localtime(now)) + f"-{pid}"


def prepare(env: Mapping[str, str], workdir: Path, now: float, pid: int) -> LocalRun:
    """The run's variables: the chosen profile's, then the job files'. A profile that cannot be used is an error."""
    files = JobFiles(StateFolders(workdir).local_runs / stem(now, pid))
    try:
        profiles = environment.load_profiles(env.get(PROFILE_FILE_VAR) or None)
        chosen = env.get(ENV_PROFILE_VAR) or profiles.default
        selection = environment.select(profiles, chosen, ENV_PROFILE_VAR) if chosen else None
        profile = environment.resolve(profiles, selection) if selection else {}
    except environment.EnvProfileError as err:
        raise SystemExit(f"multinode torchrun: {err}") from err
    variables = environment.nccl_variables(profile.get("nccl") or {})
    if (profile.get("nccl") or {}).get("dump_on_timeout"):
        variables[environment.FLIGHT_RECORDER_FILE] = str(files.nccl_traces)
    variables |= environment.plain_variables(profile)
    variables |= {
        protocol.METRICS_FILE_VAR: str(files.metrics),
        protocol.PREEMPT_FILE_VAR: str(files.preempt_marker),
        protocol.LOG_STEM_VAR: str(files.prefix),
    }
    said = [f"profile {selection or '(none)'}: " + " ".join(f"{k}={v}" for k, v in variables.items())]
    replaced = [k for k, v in variables.items() if env.get(k, v) != v]
    if replaced:
        said.append(f"replaced as in a job (the profile's values win): {', '.join(replaced)}")
    if unapplied := [k for k in SOFTWARE if profile.get(k)]:
        said.append(
            f"not applied here: the profile's {', '.join(unapplied)} (they choose the software: set them up in "
            f"your shell first; this run uses {sys.executable})"
        )
    said.append(f"not here: {NOT_HERE}")
    return LocalRun(files, variables, tuple(said))


def main(argv: Sequence[str]) -> int:
    opts, script = launcher.split_torchrun_args(argv)
    launcher.refuse_container_without_step(os.environ)
    run = prepare(os.environ, Path.cwd(), time.time(), os.getpid())
    run.files.prefix.parent.mkdir(parents=True, exist_ok=True)
    for line in run.said:
        launcher.log(line)
    env = dict(os.environ) | run.variables
    launcher.check_python(env)
    code = launcher.run_outside(opts, script, env)
    if (last := progress.read(run.files.metrics)) is not None:
        launcher.log(f"last progress: {last.describe(eta=False)} ({run.files.metrics})")
    preempt = run.files.preempt_marker
    if code == 0 and preempt.exists():
        step = preempt.read_text().strip()
        launcher.log(
            f"the training checkpointed on the signal (step {step}, {preempt}): a job would requeue itself here "
            f"and its rerun resume; exit {protocol.EXIT_PREEMPTED}"
        )
        return protocol.EXIT_PREEMPTED
    return code
