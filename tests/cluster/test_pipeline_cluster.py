"""workflows/: preprocess -> train (ColossalAI, one torchrun per node) -> evaluate on the local SLURM cluster."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from PIL import Image

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.watching.report_files import COLOURS
from tests.helpers import ANY_FIRST_SCRIPT, REPO, background, example_pipeline, run_log_names, slurm, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def pipeline_copy(tmp_path: Path, **train) -> Path:
    """The example workflow in a fresh folder, with train values overridden."""
    wd = tmp_path / "pipeline"
    shutil.copytree(REPO / "workflows", wd / "workflows", ignore=shutil.ignore_patterns("results", ".snakemake"))
    cfg_path = wd / "workflows" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["train"].update(train)
    cfg_path.write_text(yaml.safe_dump(cfg))
    return wd


SNAKEMAKE = example_pipeline("local")


def snakemake(wd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, *args], cwd=wd, capture_output=True, text=True, timeout=timeout)


def logged_steps(metrics: Path) -> list[int]:
    """Steps of the complete lines of a metrics file that training is appending to."""
    try:
        text = metrics.read_text()
    except FileNotFoundError:
        return []
    records = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
    return [r["step"] for r in records if "event" not in r]  # step lines (events: checkpoints, resumes)


def rank_pids(jobid: str, workdir: Path) -> dict[int, int]:
    """{RANK: pid} of the training processes of one SLURM job, found by their environment and working directory
    (another cluster on this machine may run a job of the same id), never by name. The folder is compared by device
    and inode: a job of the 24.11 sandbox runs in a mount namespace of its own, where its path reads otherwise."""
    found: dict[int, int] = {}
    here = workdir.stat()
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            env = (proc_dir / "environ").read_bytes().split(b"\0")
            cwd = (proc_dir / "cwd").stat()
        except OSError:  # gone, or a kernel thread
            continue
        rank = next((e[len(b"RANK=") :] for e in env if e.startswith(b"RANK=")), None)
        same_dir = (cwd.st_dev, cwd.st_ino) == (here.st_dev, here.st_ino)
        if f"SLURM_JOB_ID={jobid}".encode() in env and rank is not None and same_dir:
            assert int(rank) not in found, f"two processes of job {jobid} with RANK={int(rank)}"
            found[int(rank)] = int(proc_dir.name)
    return found


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


USR2 = 1 << (signal.SIGUSR2 - 1)  # its bit in /proc/<pid>/status signal masks


def usr2_to_frozen_ranks(cl, job: str, workdir: Path, proc: subprocess.Popen) -> int:
    """Once training has logged step 5: stop both ranks (SIGSTOP), send the job's steps SIGUSR2 as --signal does,
    wait until both ranks hold it pending, let them continue. Returns the last step logged while they were
    stopped: no rank can be past the step after it (every step ends in collectives of all ranks), so the
    checkpoint lands within two steps of it, however fast the machine trains."""

    def metrics() -> list[list[int]]:
        return [logged_steps(m) for m in (workdir / "results" / "checkpoints").glob("*/metrics.jsonl")]

    def pending() -> bool:
        return all(int(proc_status(p)["ShdPnd"], 16) & USR2 for p in frozen)

    wait_for(lambda: any(max(s, default=0) >= 5 for s in metrics()), "metrics line of step 5", 300, proc)
    ranks = rank_pids(job, workdir)
    assert sorted(ranks) == [0, 1], ranks
    frozen: list[int] = []
    try:
        for pid in ranks.values():
            assert int(proc_status(pid)["SigCgt"], 16) & USR2, f"rank pid {pid} does not catch SIGUSR2"
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
        wait_for(lambda: all(proc_status(p)["State"].startswith("T") for p in frozen), "ranks stopped", 60, proc)
        ((*_, frozen_step),) = metrics()
        slurm(cl, "scancel", "--signal=USR2", job)
        # A stopped process keeps a caught signal pending; it is delivered when the process continues.
        wait_for(pending, "SIGUSR2 pending in both stopped ranks", 120, proc)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return frozen_step


@pytest.fixture(scope="module")
def example_run(slurm_cluster, tmp_path_factory) -> Path:
    """The example pipeline, run once for the tests of this module (each leaves its config as it found it)."""
    wd = pipeline_copy(tmp_path_factory.mktemp("example"))
    proc = snakemake(wd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return wd


def test_example_pipeline_trains_on_two_nodes_and_evaluates(example_run):
    wd = example_run
    results = wd / "results"
    metrics = [json.loads(line) for line in (results / "model" / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in metrics if "event" not in m]  # step lines
    assert metrics[-1]["step"] == 40 and metrics[-1]["loss"] < metrics[0]["loss"]
    evaluation = json.loads((results / "eval" / "metrics.json").read_text())
    assert evaluation["val_loss"] > 0 and evaluation["val_ppl"] > 1 and evaluation["model_step"] == 40
    assert (results / "eval" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train_log = next((StateFolders(wd).logs / "rule_train").rglob("*.log")).read_text()
    launched = set(re.findall(r"launching on (\S+), node_rank=(\d)", train_log))  # the job's two nodes, ranks 0, 1
    assert len(launched) == 2 and {rank for _, rank in launched} == {"0", "1"}, launched
    assert len({node for node, _ in launched}) == 2, launched

    # run again: nothing to do
    again = snakemake(wd)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    # change a training value: train and evaluate rerun, preprocessing does not
    cfg_path = wd / "workflows" / "config.yaml"
    original = cfg_path.read_text()
    cfg = yaml.safe_load(original)
    cfg["train"]["lr"] = 0.002
    cfg_path.write_text(yaml.safe_dump(cfg))
    try:
        dry = snakemake(wd, "-n")
    finally:
        cfg_path.write_text(original)
    planned = dry.stdout + dry.stderr
    assert "rule train:" in planned and "rule evaluate:" in planned
    assert "rule preprocess:" not in planned and "rule merge:" not in planned


WALK = Path(__file__).with_name("report_walk.js")


def browse(report: Path, last: str, folder: Path) -> tuple[dict, Path]:
    """Snakemake's report read in headless Chromium (Debian's package: scripts/bootstrap.sh) by report_walk.js, in
    one browser start: what its rendered page showed, step by step, and a screenshot of its end (`last` in view)."""
    source = report.read_text()
    end = source.rfind("</body>")
    walked = folder / "walked.html"
    walk = f"<script>window.WALK_LAST = {json.dumps(last)};</script><script>{WALK.read_text()}</script>"
    walked.write_text(source[:end] + walk + source[end:])
    shot = folder / "report.png"
    proc = subprocess.run(
        ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={folder / 'profile'}",
         "--disable-web-security",  # the walk reads the text of the pages the report shows in frames (data: URIs)
         "--virtual-time-budget=600000",  # the page's timers run on virtual time: the walk's waits never race load
         "--window-size=1280,900", f"--screenshot={shot}", "--dump-dom", walked.as_uri()],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0 and '<pre id="walk">' in proc.stdout, proc.stderr[-3000:]
    return json.loads(html.unescape(proc.stdout.rpartition('<pre id="walk">')[2].partition("</pre>")[0])), shot


def colour_pixels(png: Path, colour: str) -> int:
    rgb = tuple(int(colour[k : k + 2], 16) for k in (1, 3, 5))
    with Image.open(png) as img:
        counts = img.convert("RGB").getcolors(maxcolors=1 << 24) or []
    return sum(n for n, px in counts if all(abs(a - b) <= 2 for a, b in zip(px, rgb, strict=True)))


@pytest.mark.one_release  # what Snakemake's report shows depends on no SLURM release
def test_snakemakes_report_shows_the_loss_curve_the_allocation_chart_and_each_outputs_provenance(example_run, tmp_path):
    wd = example_run
    proc = snakemake(wd, "--report", "report.html")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    job = next((StateFolders(wd).logs / "rule_train").rglob("*.log")).name.split(".")[0]
    walk, shot = browse(wd / "report.html", "results/report/allocation.svg", tmp_path)
    assert walk["error"] is None, walk
    assert {"Training", "Allocation", "Provenance"} <= set(walk["menu"]), walk["menu"]
    shown = walk["results"]
    loss, chart = shown["results/eval/loss.png"], shown["results/report/allocation.svg"]
    assert (loss["category"], loss["kind"], loss["type"]) == ("Training", "image", "image/png") and loss["width"] > 0
    assert "Training loss per step" in loss["info"]  # its caption, rendered
    assert (chart["category"], chart["kind"], chart["type"]) == ("Allocation", "image", "image/svg+xml")
    assert chart["width"] > 0 and "Where the allocation went: one bar per training job" in chart["info"]
    efficiency = shown["results/report/efficiency.html"]
    assert efficiency["category"] == "Allocation" and efficiency["kind"] == "page"
    assert "Where the allocation went" in efficiency["text"] and f"train - {job}" in efficiency["text"]
    prov = shown["results/report/provenance.html"]
    assert prov["category"] == "Provenance" and "Provenance of each result" in prov["info"]
    assert f"results/model/final.pt train {job} (1 run(s)) node[1-2]" in prov["text"], prov["text"]
    assert "results/eval/loss.png evaluate" in prov["text"] and "torch 2.13.0" in prov["text"]
    # the walk ended with the chart in view: its bars were drawn (the productive share's colour is on the screen)
    assert colour_pixels(shot, COLOURS["productive"]) > 50


def test_usr2_during_training_checkpoints_requeues_and_the_rerun_resumes_at_that_step(slurm_cluster, tmp_path):
    """ColossalAI training under the executor: SIGUSR2 (what --signal=USR2@T sends) while it trains makes it
    checkpoint at a step boundary and the job requeue itself; the rerun resumes at exactly that step. The ranks are
    frozen while the signal is sent, so however fast the machine trains, the signal arrives mid-training."""
    steps = 100
    wd = pipeline_copy(
        tmp_path, steps=steps, ckpt_every=0, log_every=1, n_layer=2, d_model=64, seq_len=64, micro_batch=4
    )
    cfg_path = wd / "workflows" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["train_resources"].update(nodes=2, gpus=1, cpus_per_task=1, runtime=60)  # no time-limit signal in the test
    cfg_path.write_text(yaml.safe_dump(cfg))
    logdir = StateFolders(wd).logs / "rule_train"
    with background(wd, "results/model/final.pt", command=SNAKEMAKE) as sm:  # left early: Ctrl-C, jobs cancelled
        script = wait_for(lambda: next(logdir.rglob(ANY_FIRST_SCRIPT), None), "the train job", 300, sm.proc)
        job = script.name.split(".")[0]
        frozen_step = usr2_to_frozen_ranks(slurm_cluster, job, wd, sm.proc)
        assert 5 <= frozen_step <= steps - 3, frozen_step
        rc = sm.wait(600)
    assert rc == 0, sm.text[-5000:]
    logs = sorted(logdir.rglob("*.log"))
    assert [p.name for p in logs] == run_log_names(job, 1)  # one log per run
    first, rerun = (p.read_text() for p in logs)
    checkpointed = re.search(r"^\[\S+ rank0\] SIGUSR2: checkpointed step (\d+), exiting for requeue$", first, re.M)
    assert checkpointed, first
    n = int(checkpointed[1])
    assert frozen_step <= n <= frozen_step + 2  # at the step boundary after the signal
    assert f"[multinode] checkpointed after SIGUSR2 ({n})" in first and "[multinode] requeued;" in first
    resumed = re.search(r"^\[\S+ rank0\] resumed from (\S+) at step (\d+)$", rerun, re.M)  # labelled by node and rank
    assert resumed and int(resumed[2]) == n, rerun
    assert Path(resumed[1]).name == f"step_{n:08d}"
    assert f"steps {n}->{steps}" in rerun and f"done: step {steps}" in rerun
    metrics_lines = [json.loads(line) for line in (wd / "results/model/metrics.jsonl").read_text().splitlines()]
    metrics_lines = [m for m in metrics_lines if "event" not in m]  # step lines
    assert [m["step"] for m in metrics_lines] == list(range(1, steps + 1))  # no step lost or repeated
    assert (wd / "results" / "model" / "final.pt").stat().st_size > 0
