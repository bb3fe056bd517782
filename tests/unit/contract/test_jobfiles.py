"""A job's files are named in one place (contract/jobfiles.py): the job script's shell words name the same files as
the Python paths the watchers read, and no other module of the core spells a file name of its own.
The tests that start processes: tests/process/contract/test_jobfiles.py."""

from __future__ import annotations

import ast
import re

import pytest

from snakemake_executor_multinode.contract.jobfiles import (
    LOGS_DIR,
    STATE_DIR,
    JobFiles,
    PendingFiles,
    StateFolders,
    array_script,
)
from tests.helpers import REPO

CORE = REPO / "snakemake_executor_multinode"


def test_restart_logs_come_oldest_first_and_only_the_jobs_own(tmp_path):
    files = JobFiles.of(tmp_path, "7", 1)
    for name in ["7.attempt1.restart10.log", "7.attempt1.restart2.log", "7.attempt1.restart1.log",
                 "7.attempt11.restart1.log", "7.attempt1.restartx.log", "7.attempt1.restart3.node1.out"]:  # fmt: skip
        (tmp_path / name).write_text("")
    assert [p.name for p in files.restart_logs()] == [f"7.attempt1.restart{k}.log" for k in (1, 2, 10)]
    assert JobFiles.from_log(tmp_path / "7.attempt1.log") == files


def test_a_nodes_outputs_are_its_own_across_restarts_and_not_a_longer_names(tmp_path):
    files = JobFiles.of(tmp_path, "7", 1)
    for name in ["7.attempt1.node1.out", "7.attempt1.restart2.node1.out", "7.attempt1.node11.out",
                 "7.attempt1.xnode1.out", "7.attempt12.node1.out"]:  # fmt: skip
        (tmp_path / name).write_text("")
    assert sorted(p.name for p in files.node_outs("node1")) == ["7.attempt1.node1.out", "7.attempt1.restart2.node1.out"]


def test_gpu_samples_are_found_by_node_and_every_file_of_a_stem_goes_with_it(tmp_path):
    files = JobFiles.of(tmp_path, "7", 1)
    for path in (files.log, files.gpu_samples("gpu-a.1"), files.gpu_samples("b"), tmp_path / "70.attempt1.log"):
        path.write_text("")
    assert files.gpu_samples_by_node() == {"b": files.gpu_samples("b"), "gpu-a.1": files.gpu_samples("gpu-a.1")}
    assert sorted(files.all_files()) == sorted([files.log, files.gpu_samples("gpu-a.1"), files.gpu_samples("b")])


def test_the_pending_names_and_the_arrays_script_lie_where_the_job_runs_them(tmp_path):
    log_dir = tmp_path / "rule_r" / "_"
    assert PendingFiles(log_dir, "mn-1-r").script == log_dir / "mn-1-r.sh"
    assert PendingFiles(log_dir, "mn-1-r").code_manifest == log_dir / "mn-1-r.code.sha256"
    assert array_script(log_dir, "mn-1-r-array3") == tmp_path / "rule_r" / "mn-1-r-array3.sh"
    assert StateFolders(tmp_path).logs == tmp_path / LOGS_DIR and StateFolders(tmp_path).state == tmp_path / STATE_DIR


# A file name or state folder spelt as a literal outside the contract (docstrings aside): the layout said twice.
SPELT = re.compile(
    r"\.snakemake/multinode|\.attempt|\.restart(?!_)|\.metrics\.jsonl|\.runs\.jsonl|\.gpu\.csv|\.code\.sha256|\.out$"
    r"|stall-request|stacks-done|stop-request|nccl-trace"
    r"|^\.(log|sh|first)$"  # a job file's suffix put after its stem (f"{stem}.log")
)  # (?!_): a tracker's tag `slurm.restart_count` (training/tracking.py) names SLURM's variable, not a job file
OWN_FILES = ("contract", "sandbox")  # the sandbox names its cluster's files, not a job's


def literals(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module (the parts of f-strings too), docstrings aside."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    return [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]  # fmt: skip


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(REPO)) for p in CORE.rglob("*.py") if p.parent.name not in OWN_FILES)
)
def test_no_module_outside_the_contract_spells_a_job_file_or_state_folder(path):
    tree = ast.parse((REPO / path).read_text())
    offenders = [f"{path}:{c.lineno}: {c.value!r}" for c in literals(tree) if SPELT.search(c.value)]
    assert offenders == []


def test_a_runs_first_output_time_is_its_nodes_earliest_and_not_a_later_runs(tmp_path):
    files = JobFiles.of(tmp_path, "7", 1)
    assert files.first_output("node1") == tmp_path / "7.attempt1.node1.first"
    assert files.restart(2).first_output("node1") == tmp_path / "7.attempt1.restart2.node1.first"
    assert files.first_output_time() is None  # none written: a launcher of the job's own
    files.first_output("node1").write_text("1800000012.5\n")
    files.first_output("node2").write_text("1800000010.25\n")
    files.first_output("node3").write_text("not a time\n")  # half written by hand: passed over, never read as 0
    files.restart(1).first_output("node1").write_text("1800000001\n")  # a later run's: earlier than none of these
    (tmp_path / "70.attempt1.node1.first").write_text("1800000000\n")  # another job's
    assert files.first_output_time() == 1800000010.25
    assert files.restart(1).first_output_time() == 1800000001
    assert files.restart(2).first_output_time() is None
    assert files.restart(1).first_output("node1") in files.all_files()
    assert files.node_outs("node1") == [] and files.gpu_samples_by_node() == {}  # not taken for other node files
