"""GPU use from the samplers' files (gpu_use.py), as `multinode status` and `multinode report` show it, and the job
script's sampler: on for a job with GPUs, off for any other or at 0. The real samplers run in
tests/cluster/test_gpu_samples_cluster.py."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path, PurePath

import pytest

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.planning import jobscript
from snakemake_executor_multinode.planning.plan import Planner, RuleJob, plan_job
from snakemake_executor_multinode.planning.request import build_request
from snakemake_executor_multinode.session import Settings
from snakemake_executor_multinode.watching import gpu_use, report, status_view
from snakemake_executor_multinode.watching.status_view import JobRow

# nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits
SAMPLES = """\
2026/12/04 21:52:00.123, 0, 30, 20000, 81559
2026/12/04 21:52:00.123, 1, 50, 41000, 81559
2026/12/04 21:52:30.125, 0, 70, 30000, 81559
2026/12/04 21:52:30.125, 1, [N/A], [N/A], 81559
2026/12/04 21:53:00.1
"""


def write_samples(log: Path, node: str, text: str) -> Path:
    path = JobFiles.from_log(log).gpu_samples(node)
    path.write_text(text)
    return path


def test_a_node_s_mean_utilisation_and_the_peak_memory_of_one_gpu(tmp_path):
    use = gpu_use.read(write_samples(JobFiles.of(tmp_path, "41", 1).log, "node1", SAMPLES))
    # the unreadable values and the line cut by the sampler's end count for nothing
    assert use == gpu_use.NodeGpus(samples=4, mean_util=50.0, peak_mem_mib=41000.0, total_mem_mib=81559.0)
    assert use.describe() == "util 50% mem 40.0/79.6 GiB"


def test_every_node_of_the_job_is_read_and_nothing_else(tmp_path):
    log = JobFiles.of(tmp_path, "41", 1).log
    write_samples(log, "node2", "t, 0, 10, 1024, 2048\n")
    write_samples(log, "node1", SAMPLES)
    write_samples(log, "node3", "")  # started, no sample yet
    write_samples(JobFiles.of(tmp_path, "42", 1).log, "node1", SAMPLES)  # another job
    JobFiles.from_log(log).node_out("node1").write_text("[node1 rank0] hello\n")
    found = gpu_use.for_log(log)
    assert list(found) == ["node1", "node2"]
    assert gpu_use.describe(found) == "node1 util 50% mem 40.0/79.6 GiB, node2 util 10% mem 1.0/2.0 GiB"
    assert gpu_use.for_log(JobFiles.of(tmp_path, "43", 1).log) == {}


def test_status_shows_each_sampled_job_s_nodes_below_the_table(tmp_path):
    rows = [
        JobRow("train", "", 1, "41", "RUNNING", nodes=2, gpus_per_node=2, gpu_use="node1 util 50% mem 40.0/79.6 GiB"),
        JobRow("prep", "", 1, "40", "COMPLETED", nodes=1, gpus_per_node=0),
    ]
    text = status_view.render("r1", rows, tmp_path)
    table, gpus = text.split("\n\n")
    assert "GPU use" not in table
    assert gpus.splitlines() == [
        "GPU use so far (per node: mean utilisation, peak memory of one GPU):",
        "  train (job 41): node1 util 50% mem 40.0/79.6 GiB",
    ]
    assert "GPU use" not in status_view.render("r1", rows[1:], tmp_path)


def usage(rule: str, jobid: str, gpu_use: str = "") -> report.JobUsage:
    return report.JobUsage(
        longest_run_s=60, limit_s=600, cpu_s=100.0, cpu_alloc_s=480.0, mem_req_mb=None, peak_rss_mb=None,
        rule=rule, wildcards="", jobid=jobid, state="COMPLETED", runs=1, nodes=2, gpus_per_node=2, cpus_per_node=4,
        elapsed_s=60, gpu_hours=0.07, gpu_use=gpu_use,
    )  # fmt: skip


def test_the_report_has_a_gpu_section_per_sampled_job():
    sampled = usage("train", jobid="41", gpu_use="node1 util 50% mem 40.0/79.6 GiB")
    text = report.to_markdown(report.Report("r1", [sampled, usage("prep", jobid="40")], [], []))
    section = text.split("## GPU use per job")[1]
    assert "| train | - | 41 | node1 util 50% mem 40.0/79.6 GiB |" in section and "| prep |" not in section
    assert "GPU use" not in report.to_markdown(report.Report("r1", [usage("prep", jobid="40")], [], []))


def script(gpus: int, seconds: int = Settings.gpu_sample_seconds) -> str:
    req = build_request("train", {"nodes": 2, "gpus": gpus})
    ctx = jobscript.ScriptContext(
        "true", PurePath("/w d"), PurePath("logs"), PurePath("/w d/s"), "n", gpu_sample_s=seconds
    )
    return jobscript.render(req, ctx, [])


def sampler_runs(text: str, tmp_path: Path) -> bool:
    """Whether the rendered script's sampling block starts the sampler step, with nvidia-smi present (srun stubbed:
    it says it ran)."""
    block = text.split("MULTINODE_GPU_SAMPLER=\n", 1)[1].split("\nfi\n", 1)[0] + "\nfi\nwait\n"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("nvidia-smi", "exit 0"), ("srun", f'echo ran > "{tmp_path}/srun"')):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "srun").unlink(missing_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MULTINODE_JOB_KEY": "41", "NODE_NUM": "2"}
    subprocess.run(["bash", "-c", block], env=env, check=True)
    return (tmp_path / "srun").exists()


@pytest.mark.parametrize(("gpus", "seconds", "runs"), [(2, 30, True), (0, 30, False), (2, 0, False)])
def test_a_job_with_gpus_starts_the_sampler_unless_the_setting_is_0(tmp_path, gpus, seconds, runs):
    assert sampler_runs(script(gpus, seconds), tmp_path) is runs


def test_the_sampler_writes_each_node_s_file_beside_the_log_every_n_seconds():
    text = script(2, 7)
    assert "export MULTINODE_GPU_SAMPLES='/w d/logs'/\"$MULTINODE_JOB_KEY\".attempt1\n" in text
    assert jobscript.gpu_sampler(7) in text.replace("'\"'\"'", "'")  # bash -c's one argument, quoted
    assert jobscript.gpu_sampler(7).endswith('-l 7 >>"$MULTINODE_GPU_SAMPLES"."$SLURMD_NODENAME".gpu.csv')


def test_the_sampler_outlives_the_signal_before_the_time_limit(tmp_path):
    """SLURM's USR2 (and a rule's USR1) reaches the sampler step's task too: it keeps sampling. The stand-in
    nvidia-smi is a process with no handler of its own, as the real one, which ran on the lent H100 through a USR2
    to every step (benchmarks/gpu/results-first-job-h100.txt)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/bash\nwhile :; do echo sample; sleep 0.05; done\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MULTINODE_GPU_SAMPLES": str(tmp_path / "s"), "SLURMD_NODENAME": "n1"}
    proc = subprocess.Popen(["bash", "-c", jobscript.gpu_sampler(1)], env=env)
    samples = tmp_path / "s.n1.gpu.csv"
    deadline = time.monotonic() + 60
    while not samples.exists() or not samples.read_text():
        assert time.monotonic() < deadline, "no sample"
        time.sleep(0.05)
    for sig in (signal.SIGUSR2, signal.SIGUSR1):
        proc.send_signal(sig)  # the task: bash exec'd into the sampler, as srun runs it
    before = samples.read_text().count("sample")
    while samples.read_text().count("sample") < before + 3:
        assert proc.poll() is None, f"the sampler died of the signal (exit {proc.returncode})"
        assert time.monotonic() < deadline, "no sample after the signal"
        time.sleep(0.05)
    proc.terminate()
    proc.wait(timeout=60)


@pytest.mark.parametrize(("seconds", "runs"), [(5, True), (0, False)])
def test_the_setting_reaches_the_job_script(tmp_path, seconds, runs):
    planner = Planner(Settings(gpu_sample_seconds=seconds, snapshot="off"), tmp_path, "r1")
    plan = plan_job(RuleJob("train", {"nodes": 2, "gpus": 1}, "true", shellcmd="multinode torchrun t.py"), planner)
    assert sampler_runs(plan.script, tmp_path) is runs
    assert ("-l 5 " in plan.script) is runs
