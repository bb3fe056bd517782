"""The straggler check (launching/straggler.py): busy-time events, the output-rate fallback, the window, the actions.

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_straggler.py."""

from __future__ import annotations

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.launching import launcher, straggler
from tests.helpers import Job, event


def test_a_straggler_ends_the_step_with_its_node_blamed_for_a_spare(tmp_path, capfd, monkeypatch):
    """The launcher's supervision: the fake srun's training reports node2 five times slower; under on_straggler
    replace with a spare left the step ends (gently, SIGUSR1) and its end blames node2 for the spare to replace."""
    monkeypatch.setattr(straggler, "TICK_S", 0.0)
    job = Job(tmp_path, on="replace", nodes=["node1", "node2"])
    job.env[protocol.STRAGGLER_WINDOW_VAR] = "1"
    line = event({"node1": 0.1, "node2": 0.5})
    srun = tmp_path / "srun"
    srun.write_text(f"#!/bin/bash\ntrap 'exit 1' USR1\nwhile :; do echo '{line}' >> {job.metrics}; sleep 0.2; done\n")
    srun.chmod(0o755)
    end = launcher.launch_step([str(srun)], job.env, ["node1", "node2"], spare_left=True)
    assert end.failure is not None and (end.failure.node, end.failure.rank) == ("node2", 1)
    assert end.failure.what.startswith("straggler: node node2's ranks 0.5 busy s/step against 0.1")
    assert launcher.failure_why(end.failure) == end.failure.what
    err = capfd.readouterr().err
    assert "[multinode torchrun] straggler: node node2's ranks" in err and "step ended: straggler" in err, err
