"""SLURM's pending reasons in plain words, with what to do: `multinode status` shows them under the table, and
Snakemake's log says them once for a job that has waited longer than a while (session.py)."""

from __future__ import annotations

from dataclasses import dataclass

NO_REASON = {"", "None", "(null)"}  # SLURM has not said why yet (a job just submitted reads "None")


@dataclass(frozen=True)
class Explained:
    words: str  # what it means
    todo: str  # what to do about it ("" where nothing is to be done)
    hopeless: bool = False  # it will never start: a failure, not a wait


REASONS: dict[str, Explained] = {
    "Resources": Explained("waiting for free nodes with the CPUs, memory and GPUs it asked for", ""),
    "Priority": Explained(
        "jobs of higher priority are ahead of it in the queue", "`sprio -j <job>` shows its priority"
    ),
    "Dependency": Explained("waiting for the jobs it depends on to finish", ""),
    "DependencyNeverSatisfied": Explained(
        "a job it depends on failed or was cancelled: it can never start", "it is reported as failed", hopeless=True
    ),
    "ReqNodeNotAvail": Explained(
        "a node it needs is down, drained or reserved",
        "`sinfo -R` says why; drop nodelist/exclude a node, or wait for the admins",
    ),
    "PartitionTimeLimit": Explained(
        "its runtime is longer than the partition allows", "lower runtime, or choose a partition with a longer limit"
    ),
    "PartitionNodeLimit": Explained(
        "it asks for more nodes than the partition allows", "lower nodes, or choose another partition"
    ),
    "QOSMaxGRESPerUser": Explained(
        "your QOS allows you fewer GPUs at a time than your running jobs and this one would hold",
        "wait for your other GPU jobs, or ask for fewer GPUs",
    ),
    "AssocGrpGRES": Explained(
        "your account's GPU limit is reached by its running jobs", "wait, or use another account (slurm_account)"
    ),
    "AssocGrpCpuLimit": Explained(
        "your account's CPU limit is reached by its running jobs", "wait, or ask for fewer CPUs"
    ),
    "QOSMaxJobsPerUserLimit": Explained(
        "you already run as many jobs as your QOS allows", "wait for your other jobs, or lower Snakemake's --jobs"
    ),
    "AssocMaxJobsLimit": Explained(
        "your account already runs as many jobs as it may", "wait for its other jobs, or lower Snakemake's --jobs"
    ),
    "BeginTime": Explained("its start time (--begin) has not come yet", ""),
    "JobHeldUser": Explained("held by you (scontrol hold)", "`scontrol release <job>` lets it start"),
    "JobHeldAdmin": Explained("held by an administrator", "ask the admins, or `scancel <job>`"),
    "InvalidAccount": Explained(
        "the account does not exist or you may not use it: it cannot start",
        "`sacctmgr show assoc user=$USER` lists yours; set slurm_account",
        hopeless=True,
    ),
    "InvalidQOS": Explained(
        "the QOS does not exist or your account may not use it: it cannot start",
        "`sacctmgr show assoc user=$USER format=account,qos` lists yours; set qos",
        hopeless=True,
    ),
    "Reservation": Explained("waiting for its reservation to start", ""),
    "Licenses": Explained("waiting for licenses", ""),
}


def explain(reason: str) -> Explained | None:
    """The plain words for a pending reason (squeue's %r), None for one not in the table (shown as SLURM says it)."""
    if reason in REASONS:
        return REASONS[reason]
    return REASONS.get(reason.split(",")[0].split("(")[0].strip())


def say(reason: str, jobid: str = "<job>") -> str:
    """'<reason>: <words>; <what to do>', the job's id in the commands."""
    known = explain(reason)
    if known is None:
        return reason
    return f"{reason}: {known.words}" + (f"; {known.todo.replace('<job>', jobid)}" if known.todo else "")
