"""What the adapter needs from a Snakemake job, read in one place: `job_facts(job) -> JobFacts`.

Every Snakemake attribute here is read directly, never through `getattr(obj, name, default)`: when a Snakemake
release renames one, the adapter fails with AttributeError instead of silently running a conda, container or pipe
job as a plain shell command. The names were checked against snakemake 9.27.1 (snakemake/jobs.py `Job` and
`GroupJob`, snakemake/rules.py `Rule`, snakemake/io/__init__.py `_IOFile`, snakemake/resources.py `Resources` and
`Resource`); tests/process/adapter/test_job_facts.py reads them on real jobs built from small Snakefiles.

Importing this module stays cheap: it imports nothing from Snakemake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snakemake_executor_multinode.session import RunReason

# Output/input flags (snakemake.io: pipe(), service()) whose files only exist while a Snakemake process inside the
# job manages them.
_STREAM_FLAGS = ("pipe", "service")


@dataclass(frozen=True)
class JobFacts:
    """One Snakemake job (or group job) as the adapter sees it."""

    name: str  # the rule name; `group_<group job name>` for a group job
    is_group: bool
    wildcards: dict[str, str]
    threads: int
    attempt: int
    resources: dict[str, Any]  # the job's evaluated resources, without Snakemake's internal `_`-prefixed ones
    declared_nodes: int | None  # `nodes` as the rule declares it (before --resources nodes=N caps the job)
    shellcmd: str | None  # the formatted shell command; None for script/run/... rules and group jobs
    outputs: tuple[str, ...]
    logs: tuple[str, ...]
    inner_snakemake_reason: str | None  # why the job needs a Snakemake process inside; None: run shellcmd directly
    # The rule's `container:` image when Snakemake would run the job in it (--software-deployment-method apptainer)
    container_image: str | None = None

    @property
    def needs_inner_snakemake(self) -> bool:
        return self.inner_snakemake_reason is not None

    @property
    def resources_known(self) -> bool:
        """False while a resource depends on input that the run makes: Snakemake's main process shows it as
        <TBD> (tmpdir always, which the plan does not read)."""
        return not any(str(v) == "<TBD>" for k, v in self.resources.items() if k != "tmpdir")


def job_facts(job: Any) -> JobFacts:
    """Read what the adapter needs from `job` (a snakemake.jobs.Job or GroupJob). Raises AttributeError when
    Snakemake no longer has an attribute this relies on."""
    resources = {str(k): v for k, v in job.resources.items() if not str(k).startswith("_")}
    if job.is_group():
        # A group runs several rules in one allocation: only a Snakemake process inside can schedule them (and the
        # pipes between them). Job-only attributes (rule, wildcards_dict, shellcmd, ...) do not exist on GroupJob.
        return JobFacts(
            name=f"group_{job.name}",
            is_group=True,
            wildcards={},
            threads=job.threads,
            attempt=job.attempt,
            resources=resources,
            declared_nodes=None,
            shellcmd=None,
            outputs=tuple(str(f) for f in job.output),
            logs=tuple(str(f) for f in job.log),
            inner_snakemake_reason="group job",
        )
    shellcmd = job.shellcmd if job.is_shell else None
    return JobFacts(
        name=job.name,
        is_group=False,
        wildcards={str(k): str(v) for k, v in (job.wildcards_dict or {}).items()},
        threads=job.threads,
        attempt=job.attempt,
        resources=resources,
        declared_nodes=declared_nodes(job.rule),
        shellcmd=shellcmd,
        outputs=tuple(str(f) for f in job.output),
        logs=tuple(str(f) for f in job.log),
        inner_snakemake_reason=_inner_snakemake_reason(job, shellcmd),
        container_image=_container_image(job),
    )


def declared_nodes(rule: Any) -> int | None:
    """`nodes` as the rule declares it (resources:, --set-resources, --default-resources), or None when it is not
    a plain integer (unset, a string, a function of wildcards/input/attempt).

    Snakemake's `--resources nodes=N` silently caps the job's evaluated `nodes` at N; comparing with this value is
    how the adapter notices. On Snakemake 9.27 `rule.resources` is a `snakemake.resources.Resources` mapping of
    name -> `Resource` (the value behind `.value`, a function when `.is_evaluable()`); a plain int is accepted too.
    """
    resources = rule.resources
    if "nodes" not in resources:
        return None
    declared = resources["nodes"]
    if isinstance(declared, bool) or declared is None or isinstance(declared, str) or callable(declared):
        return None
    if not isinstance(declared, int):  # a snakemake.resources.Resource
        if declared.is_evaluable():
            return None
        declared = declared.value
    return declared if isinstance(declared, int) and not isinstance(declared, bool) else None


def _container_image(job: Any) -> str | None:
    """The job's `container:` image (its own or the workflow's) when Snakemake deploys containers; None when it
    would ignore the directive (no apptainer deployment method)."""
    from snakemake.settings.types import DeploymentMethod  # Snakemake is loaded whenever there is a job

    if DeploymentMethod.APPTAINER not in job.dag.workflow.deployment_settings.deployment_method:
        return None
    return str(job.container_img_url) if job.container_img_url else None


def _inner_snakemake_reason(job: Any, shellcmd: str | None) -> str | None:
    """Why `job` (a single Job) cannot run as its formatted shell command alone; None when it can."""
    if not job.is_shell:
        for kind, is_kind in (
            ("script", job.is_script),
            ("notebook", job.is_notebook),
            ("wrapper", job.is_wrapper),
            ("cwl", job.is_cwl),
            ("template_engine", job.is_template_engine),
        ):
            if is_kind:
                return f"{kind} rule"
        return "rule without an action" if job.is_norun else "run: block"
    if not shellcmd or not shellcmd.strip():
        return "empty shell command"
    if job.conda_env_spec:
        return "conda environment"
    if job.container_img_url:
        return "container image"
    if job.env_modules:
        return "environment modules"
    if job.rule.shadow_depth:
        return f"shadow directory ({job.rule.shadow_depth})"
    if job.benchmark:
        return "benchmark file"
    for f in (*job.input, *job.output, *job.log):
        if f.is_storage:
            return f"storage file {f}"
        for flag in _STREAM_FLAGS:
            if f.flags.get(flag):
                return f"{flag} file {f}"
    for f in job.output:
        if f.flags.get("touch"):
            return f"touch output {f}"
    return None


def rerun_reason(job: Any) -> RunReason:
    """Why Snakemake runs `job` (a Job or GroupJob) in this run, for the reattach decision.

    Snakemake's own `Reason.forced` cannot tell `-F` from `--rerun-incomplete` (it adds the incomplete files to the
    forced ones): the user's forcing is read from the rules and targets the DAG was told to force."""
    dag = job.dag
    settings = dag.workflow.dag_settings
    members = list(job.jobs) if job.is_group() else [job]
    forced = any(
        (m.rule in dag.forcerules and m not in dag.omitforce) or (settings.forcetargets and m in dag.targetjobs)
        for m in members
    )
    changed: list[str] = []
    for m in members:
        reason = dag.reason(m)
        for what, found in (
            ("updated input files", reason.updated_input),
            ("a changed set of input files", reason.input_changed),
            ("changed code", reason.code_changed),
            ("changed params", reason.params_changed),
            ("a changed software environment", reason.software_stack_changed),
        ):
            if found and what not in changed:
                changed.append(what)
    # Snakemake's incomplete marker names the SLURM job it last saw running for these outputs
    incomplete = dag.workflow.persistence.external_jobids(job) if settings.force_incomplete else []
    return RunReason(forced=forced, changed=tuple(changed), incomplete_jobids=tuple(str(j) for j in incomplete))
