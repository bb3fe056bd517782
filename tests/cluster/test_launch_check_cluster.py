"""No silent traps, end to end on the real local cluster: a multi-node rule whose command would leave its other
nodes idle stops the run before anything is submitted; own_launcher=True runs it; a CPU multi-node rule runs with
a warning; the submission line states the stall watchdog."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import jobs_from, snakemake

pytestmark = pytest.mark.cluster


def workflow(tmp_path: Path, name: str, text: str) -> Path:
    wd = tmp_path / name
    wd.mkdir()
    (wd / "Snakefile").write_text(text)
    return wd


def test_a_multinode_rule_without_a_launcher_stops_the_run_before_any_submission(slurm_cluster, tmp_path):
    wd = workflow(
        tmp_path,
        "nolauncher",
        'rule all:\n    input: "b.txt"\n'
        'rule a:\n    output: "a.txt"\n    shell: "touch {output}"\n'
        'rule b:\n    input: "a.txt"\n    output: "b.txt"\n    resources: nodes=2, gpus=1\n'
        '    shell: "cd . && python3 -c pass && touch {output}"\n',
    )
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    assert (
        "rule b: nodes=2, gpus=1 but its command never starts `multinode torchrun`: it would run on the head node only "
        "while 1 node(s) idle. Write `multinode torchrun train.py ...`, name your launcher in --multinode-launchers, "
        "or set resources own_launcher=True if the script starts its ranks itself (srun, mpirun)."
    ) in proc.stderr + proc.stdout
    assert jobs_from(slurm_cluster, wd) == set() and not (wd / "a.txt").exists()  # not even the upstream job ran


def test_a_script_rule_on_two_nodes_is_refused_and_a_named_launcher_is_accepted(slurm_cluster, tmp_path):
    wd = workflow(
        tmp_path,
        "script",
        'rule s:\n    output: "s.txt"\n    resources: nodes=2, gpus=1\n    run:\n        open(output[0], "w")\n',
    )
    proc = snakemake(wd, check=False)
    assert proc.returncode != 0
    assert "rule s: nodes=2, gpus=1 but it is a run: block, so nothing starts `multinode torchrun`" in (
        proc.stderr + proc.stdout
    )
    assert jobs_from(slurm_cluster, wd) == set()
    bad = snakemake(wd, "--multinode-launchers", "no-such-launcher-xyz", check=False)
    assert "--multinode-launchers='no-such-launcher-xyz': 'no-such-launcher-xyz' is not a command on PATH" in (
        bad.stderr + bad.stdout
    )
    assert jobs_from(slurm_cluster, wd) == set()


def test_own_launcher_runs_a_multinode_rule_that_starts_its_ranks_with_srun(slurm_cluster, tmp_path):
    wd = workflow(
        tmp_path,
        "own",
        'rule own:\n    output: "hosts.txt"\n    resources: nodes=2, gpus=1, own_launcher=True\n'
        '    shell: "srun hostname | sort -u > {output}"\n',
    )
    proc = snakemake(wd)
    assert len((wd / "hosts.txt").read_text().split()) == 2
    assert "stall watchdog" not in proc.stderr + proc.stdout  # the watchdog is multinode torchrun's


def test_a_cpu_multinode_rule_runs_with_a_warning_and_the_watchdog_is_stated_at_submission(slurm_cluster, tmp_path):
    wd = workflow(
        tmp_path,
        "cpu",
        'rule cpu:\n    output: "out.txt"\n    resources: nodes=2\n'
        '    shell: "multinode torchrun hello.py && echo done > {output}"\n',
    )
    (wd / "hello.py").write_text("print('hello')\n")
    proc = snakemake(wd)
    text = proc.stderr + proc.stdout
    assert text.count("rule 'cpu': nodes=2 without gpus: a CPU multi-node job.") == 1
    assert "node(s) x 0 GPU(s)), stall watchdog adaptive (10x the interval between step lines, at least 30 s; " in text
    assert "; resources stall_timeout), up to 3 in-job restart(s) (resources max_restarts); log " in text
    assert (wd / "out.txt").read_text() == "done\n"
