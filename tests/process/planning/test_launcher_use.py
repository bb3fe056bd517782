"""No silent traps: a rule that asks for nodes (or several GPUs on one node) its command would leave idle is refused
before submission, with the fix in the message; own_launcher=True and --multinode-launchers say the command starts
its ranks itself. A CPU multi-node rule is accepted with a warning; the stall watchdog is said at submission.

Here the tests that start processes (the process tier); the others: tests/unit/planning/test_launcher_use.py."""

from __future__ import annotations


def test_preview_refuses_what_the_executor_would(tmp_path, capsys):
    from snakemake_executor_multinode.cli.main import main

    assert main(["preview", "--workdir", str(tmp_path), "nodes=2", "gpus=2", "--", "python", "train.py"]) == 2
    assert "rule rule: nodes=2, gpus=2 but its command never starts `multinode torchrun`" in capsys.readouterr().err


def test_preview_gives_a_sites_launcher_no_watchdog_as_the_run_does(tmp_path, capsys):
    from snakemake_executor_multinode.cli.main import main

    argv = ["preview", "--workdir", str(tmp_path), "--launchers", "bash", "nodes=2", "--", "bash", "ranks.sh"]
    assert main(argv) == 0
    assert "MULTINODE_STALL_TIMEOUT=0 " in capsys.readouterr().out
