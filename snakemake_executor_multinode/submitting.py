"""The submission sequence of one run: a short fixed sequence of small steps (as submitit's core): reattach or [write
the script, record, sbatch, record the job id] -> track. session.py, the adapter's door, hands each plan here.

A job is recorded before sbatch (Ctrl-C during sbatch still finds it by its name), its script kept under a name of
its own (a refused script can be read), and a job sbatch took whose record cannot be written is cancelled at once:
no job runs that this run, Ctrl-C or a rerun's reattach would not know of.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from snakemake_executor_multinode.contract.jobfiles import PendingFiles, array_script
from snakemake_executor_multinode.planning import environment, jobscript, snapshot
from snakemake_executor_multinode.planning.launcher_use import watchdog
from snakemake_executor_multinode.planning.plan import JobPlan
from snakemake_executor_multinode.slurm.client import QueryError, SlurmClient, SubmitError, job_order
from snakemake_executor_multinode.util.private_files import StateWriteError, write_private
from snakemake_executor_multinode.watching import provenance, reattach
from snakemake_executor_multinode.watching.job_status import JobStatus
from snakemake_executor_multinode.watching.reattach import RunReason
from snakemake_executor_multinode.watching.registry import Registry, Submission

Say = Callable[[str], None]

# SLURM's MaxArraySize defaults to 1001 (task ids 0-1000): a larger group goes as several arrays.
MAX_ARRAY = 1000


class SubmitRefused(RuntimeError):
    """sbatch refused the job; the message names the rule and where the script was kept."""


class NotSubmitted(SubmitRefused):
    """A file of the plugin's state (the job script, its record) could not be written, a full disk above all: the job
    was not submitted, or, where its record failed after sbatch, cancelled at once (never a job this run cannot
    track). The message names the file, the bytes needed and the bytes free (private_files.StateWriteError)."""


@dataclass
class Submitter:
    """Submits the plans of one run and tracks what it started (the job status watch expects each job)."""

    workdir: Path
    run_id: str
    client: SlurmClient
    registry: Registry
    job_status: JobStatus
    profiles: environment.ProfileSet  # the environment a job's provenance record names
    info: Say
    warning: Say
    warn_once: Callable[[Iterable[str]], None]  # a plan's warnings, each said once per run
    cancelled: set[str]  # the job ids this run has cancelled (the Session's): each job is cancelled once
    reattach: bool = True  # --multinode-no-reattach: False
    arrays: bool = True  # --multinode-no-arrays: False
    job_ids: dict[str, str] = field(default_factory=dict)  # output file -> SLURM job id (afterok, --immediate-submit)

    def submit(self, plan: JobPlan, outputs: Sequence[str], reason: RunReason, upstream: Iterable[str] = ()) \
            -> Submission:  # fmt: skip
        """Adopt an earlier run's job (reattach.py) or submit the plan; `upstream`: the outputs of the jobs this one
        waits for (--immediate-submit: afterok on their SLURM jobs). SubmitRefused when sbatch refuses."""
        outputs = tuple(outputs)
        sub = self._adopted(plan, outputs, reason) or self._sbatch(plan, outputs, self._dependencies(upstream))
        return self._tracked(sub)

    def submit_many(self, jobs: Sequence[tuple[JobPlan, Sequence[str], RunReason]]) -> list[Submission]:
        """Jobs Snakemake hands over together, in their order: each adopts an earlier run's job where it may; of the
        rest, single-node jobs of one rule that ask SLURM for the same go as one job array (at least two, at most
        MAX_ARRAY; --multinode-no-arrays: never), every other one as a job of its own."""
        subs: dict[int, Submission] = {}
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, (plan, outputs, reason) in enumerate(jobs):
            if (earlier := self._adopted(plan, tuple(outputs), reason)) is not None:
                subs[i] = earlier
            elif plan.request.nodes == 1 and self.arrays:
                groups.setdefault((plan.request.rule, *jobscript.resource_options(plan.request)), []).append(i)
            else:
                subs[i] = self._sbatch(plan, tuple(outputs), [])
        for members in groups.values():
            for start in range(0, len(members), MAX_ARRAY):
                chunk = members[start : start + MAX_ARRAY]
                if len(chunk) == 1:
                    subs[chunk[0]] = self._sbatch(jobs[chunk[0]][0], tuple(jobs[chunk[0]][1]), [])
                    continue
                made = self._sbatch_array([(jobs[i][0], tuple(jobs[i][1])) for i in chunk])
                subs.update(zip(chunk, made, strict=True))
        return [self._tracked(subs[i]) for i in range(len(jobs))]

    def _adopted(self, plan: JobPlan, outputs: tuple[str, ...], reason: RunReason) -> Submission | None:
        self.warn_once(plan.request.warnings)
        verdict = reattach.decide(
            plan.request.rule, outputs, plan.fingerprint, reason, self.registry, self.job_status, self.workdir,
            enabled=self.reattach,
        )  # fmt: skip
        if verdict.message:
            (self.warning if verdict.warning else self.info)(verdict.message)
        return verdict.adopt

    def _tracked(self, sub: Submission) -> Submission:
        assert sub.jobid is not None
        self.job_ids.update((f, sub.jobid) for f in sub.outputs)
        self.job_status.expect(sub.jobid, sub.job_name)
        return sub

    def _prepare(self, plan: JobPlan, outputs: tuple[str, ...]) -> tuple[Path, Submission]:
        """The job's script, code manifest, provenance and record, written before sbatch: under a name of its own,
        owner-only (profiles may hold tokens), so that a refused script can be read; recorded, so that Ctrl-C during
        sbatch still finds the job."""
        req = plan.request
        folder = plan.workdir / plan.log_dir
        pending = PendingFiles(folder, plan.job_name).script
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private(pending, plan.script)
            hashed = snapshot.hashes(plan.code_files)  # read once: the manifest and the provenance record
            if hashed:  # nothing frozen: what a restart checks
                write_private(plan.code_manifest, snapshot.manifest(hashed))
            provenance.save_submission(self.workdir, plan.job_name, self._provenance(plan, outputs, hashed))
            sub = self.registry.record(
                Submission(
                    self.run_id, req.rule, dict(req.wildcards), outputs, plan.job_name, req.attempt, str(pending),
                    fingerprint=plan.fingerprint, tracking_id=plan.tracking_id,
                )
            )  # fmt: skip
        except OSError as err:  # StateWriteError, ProvenanceError, a folder that cannot be made
            raise NotSubmitted(f"rule {req.rule!r}: not submitted: {err}") from err
        return pending, sub

    def _unrecorded(self, jobid: str, rule: str, err: OSError) -> NotSubmitted:
        """sbatch took the job but its record could not be written: cancelled at once, so that no job runs that this
        run, Ctrl-C or a rerun's reattach would not know of."""
        job = jobid.split("_")[0]  # an array's element: the whole array
        try:
            self.client.cancel([job])
        except QueryError as failed:
            return NotSubmitted(
                f"rule {rule!r}: SLURM job {job}'s record could not be written: {err}; and it could not be cancelled "
                f"({failed}): `scancel {job}`"
            )
        self.cancelled.add(job)
        return NotSubmitted(f"rule {rule!r}: SLURM job {job} cancelled: its record could not be written: {err}")

    def _sbatch(self, plan: JobPlan, outputs: tuple[str, ...], extra: list[str]) -> Submission:
        req = plan.request
        pending, sub = self._prepare(plan, outputs)
        try:
            jobid = self.client.submit(pending, cwd=self.workdir, extra=extra, name=plan.job_name)
        except SubmitError as err:
            raise SubmitRefused(f"rule {req.rule!r}: sbatch refused the job: {err} (script kept at {pending})") from err
        script = plan.script_path(jobid)
        try:
            pending.rename(script)
            sub = self.registry.submitted(sub, jobid, str(plan.log_path(jobid)), str(script))
        except OSError as err:
            raise self._unrecorded(jobid, req.rule, err) from err
        self.info(
            f"rule {req.rule}: SLURM job {jobid} ({req.nodes} node(s) x {req.gpus} GPU(s))"
            f"{watchdog(req, plan.command)}; log {sub.log}"
        )
        return sub

    def _sbatch_array(self, group: list[tuple[JobPlan, tuple[str, ...]]]) -> list[Submission]:
        """One sbatch for the group: element i runs plan i's own script (kept under its job name, which the array's
        script names) under the key <array job id>_<i>; its log, markers and record are its own."""
        first = group[0][0]
        prepared = [self._prepare(plan, outputs) for plan, outputs in group]
        name = f"{first.job_name}-array{len(group)}"
        driver = array_script(first.workdir / first.log_dir, name)
        try:
            write_private(driver, jobscript.render_array(first.request, name, [pending for pending, _ in prepared]))
        except StateWriteError as err:
            raise NotSubmitted(f"rule {first.request.rule!r}: job array not submitted: {err}") from err
        try:
            jobid = self.client.submit(driver, cwd=self.workdir, name=name)
        except SubmitError as err:
            raise SubmitRefused(
                f"rule {first.request.rule!r}: sbatch refused the job array: {err} (script kept at {driver})"
            ) from err
        subs = []
        try:
            for i, ((plan, _), (pending, sub)) in enumerate(zip(group, prepared, strict=True)):
                key = f"{jobid}_{i}"
                script = plan.script_path(key)
                os.link(pending, script)  # the array's script runs the pending name; users look for the key's
                subs.append(
                    self.registry.submitted(replace(sub, array=name), key, str(plan.log_path(key)), str(script))
                )
        except OSError as err:
            raise self._unrecorded(jobid, first.request.rule, err) from err
        req = first.request
        self.info(
            f"rule {req.rule}: SLURM job array {jobid} of {len(group)} jobs ({jobid}_0 .. {jobid}_{len(group) - 1}, "
            f"{req.nodes} node(s) x {req.gpus} GPU(s) each){watchdog(req, first.command)}; "
            f"logs {subs[0].log} and beside"
        )
        return subs

    def _provenance(self, plan: JobPlan, outputs: Sequence[str], hashed: Sequence[tuple[str, Path]]) -> dict[str, Any]:
        req, frozen = plan.request, plan.snapshot
        code: dict[str, Any]
        if frozen is not None:
            code = {
                "snapshot": frozen.digest, "repository": str(frozen.repo), "commit": frozen.commit,
                "uncommitted": frozen.uncommitted, "files": len(frozen.files),
            }  # fmt: skip
        else:
            code = {"snapshot": None, "files": {str(f): h for h, f in hashed}}
        return provenance.submission(
            rule=req.rule,
            wildcards=dict(req.wildcards),
            command=plan.command,
            script=plan.script,
            code=code,
            environment=environment.resolve(self.profiles, req.env_profile),
            outputs=outputs,
            inherited_versions=not plan.versions_in_job,
            run_id=plan.tracking_id,
        )

    def _dependencies(self, upstream: Iterable[str]) -> list[str]:
        ids = {self.job_ids[f] for f in upstream if f in self.job_ids}
        if not ids:
            return []
        # A failed upstream job cancels this one instead of leaving it pending forever.
        return [f"--dependency=afterok:{':'.join(sorted(ids, key=job_order))}", "--kill-on-invalid-dep=yes"]
