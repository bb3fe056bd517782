"""The network preflight (network_check.py) on the real local SLURM cluster, through Snakemake and the real launcher.

A healthy 2- and 3-node job passes the check (one ok line per node, then the training runs). A job whose second
node (node_rank 1) has its interface down while its preflight runs ends at once, naming that node, the interface and
the error, long before the check's limit; the same for gloo told to use an interface that node lacks. The fault is
injected on that node only, by a sitecustomize the job's PYTHONPATH carries: it acts in the network_check process of
node_rank 1 alone. Downing the interface also cuts that node's slurmd traffic: the hook brings it back up as the
check exits, and the test restores it again (idempotent) and waits until SLURM answers for the node before it ends.

The measured figures (the check's cost per node, failure -> job end) are printed as `[figures] ...` (pytest -s).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from snakemake_executor_multinode.contract.jobfiles import StateFolders
from snakemake_executor_multinode.launching.network_check import PREFIX
from tests.helpers import figures, job_logs, log_times, snakemake, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.one_release]

TRAIN = "import os\nprint('TRAINING rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n"
OK = re.compile(
    re.escape(PREFIX) + r" (?P<node>\S+): all-reduce over (?P<world>\d+) ranks ok in (?P<s>[\d.]+) s "
    r"\(gloo, iface (?P<iface>\S+) .*; (?P<total>[\d.]+) s with start-up\)"
)

# Runs at the start of every Python process of the job (PYTHONPATH); acts only in node_rank 1's preflight.
HOOK = """\
import atexit, os, subprocess, sys, time
if "snakemake_executor_multinode.launching.network_check" in sys.orig_argv and os.environ.get("SLURM_NODEID") == "1":
    with open({marker!r}, "w") as fh:
        fh.write(f"{{os.uname().nodename}} {{time.time()}}\\n")
    if {mode!r} == "link-down":
        subprocess.run([{ip!r}, "link", "set", "eth0", "down"], check=True)
        atexit.register(subprocess.run, [{ip!r}, "link", "set", "eth0", "up"])
    else:
        os.environ["GLOO_SOCKET_IFNAME"] = "mnpf-missing"
"""


def workflow(wd: Path, nodes: int, gpus: int, profile: str) -> None:
    wd.mkdir(parents=True)
    (wd / "train.py").write_text(TRAIN)
    (wd / "Snakefile").write_text(
        f'rule train:\n    output: "out.txt"\n'
        f'    resources: nodes={nodes}, gpus={gpus}, env_profile="{profile}"\n'
        '    shell: "multinode torchrun train.py && touch {output}"\n'
    )


@pytest.mark.parametrize("nodes", [2, 3])
def test_the_builtin_infiniband_profile_checks_the_network_before_the_training(slurm_cluster, tmp_path, nodes):
    wd = tmp_path / "ok"
    workflow(wd, nodes, 2, "infiniband")  # the built-in profile: the check is on by default
    snakemake(wd)
    text = job_logs(wd, "train")[0].read_text()
    assert "export MULTINODE_NETWORK_CHECK=60" in next(StateFolders(wd).logs.rglob("*.sh")).read_text()
    found = [m.groupdict() for m in OK.finditer(text)]
    assert len(found) == nodes, text  # one line per node
    assert len({f["node"] for f in found}) == nodes
    assert all(f["world"] == str(nodes * 2) and f["iface"] == "eth0" for f in found), found
    assert len(re.findall(r"TRAINING rank \d of " + str(nodes * 2), text)) == nodes * 2, text
    figures(
        f"preflight {nodes} nodes x 2 ranks",
        all_reduce_s=max(float(f["s"]) for f in found),
        with_startup_s=max(float(f["total"]) for f in found),
    )


def restore(cl, host: str, ip: str) -> None:
    """Bring the node's interface back (again) and wait until slurmctld hears from the node."""
    index = next(i for i in cl.spec.node_indices if cl.spec.node_name(i) == host)
    subprocess.run(["ip", "netns", "exec", cl.spec.netns(index), ip, "link", "set", "eth0", "up"], check=True)

    def answers() -> bool:
        state = cl.run("sinfo", "-h", "-n", host, "-o", "%T", check=False).stdout.strip()
        return bool(state) and "*" not in state and not state.startswith(("down", "drain", "fail"))

    wait_for(answers, f"{host} answering slurmctld again", 300)


@pytest.mark.parametrize("mode", ["link-down", "missing-iface"])
def test_a_node_with_a_broken_interface_ends_the_job_at_once_naming_it(slurm_cluster, tmp_path, mode):
    ip = shutil.which("ip")
    assert ip
    wd = tmp_path / mode
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marker = tmp_path / "faulted"
    (hooks / "sitecustomize.py").write_text(HOOK.format(marker=str(marker), mode=mode, ip=ip))
    workflow(wd, 2, 1, "broken")
    (wd / "profiles.yaml").write_text(
        f"profiles:\n  broken:\n    extends: infiniband\n    env: {{PYTHONPATH: {str(hooks)!r}}}\n"
    )
    try:
        proc = snakemake(wd, "--multinode-profile-file", "profiles.yaml", check=False)
    finally:
        if marker.exists() and mode == "link-down":
            restore(slurm_cluster, marker.read_text().split()[0], ip)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    log = job_logs(wd, "train")[0]
    text = log.read_text()
    assert marker.exists(), f"the fault was never injected (no preflight ran on node_rank 1):\n{text}"
    host, faulted_at = marker.read_text().split()
    assert f"failing node {host}" in output, output  # Snakemake's error names the node
    failed = [line for line in text.splitlines() if line.startswith(f"{PREFIX} FAILED on {host} (node_rank 1)")]
    assert failed, text
    if mode == "link-down":  # the interface, and the error: the route is gone, c10d cannot connect
        assert "no route to MASTER_ADDR" in failed[0] and "Network is unreachable" in failed[0], failed[0]
    else:  # gloo's own words for the interface it was told to use
        assert "GLOO_SOCKET_IFNAME=mnpf-missing (mnpf-missing missing)" in failed[0], failed[0]
        assert "Unable to find address for: mnpf-missing" in failed[0], failed[0]
    assert "TRAINING" not in text  # the training never started
    assert "never reached the preflight rendezvous" not in text and "did not complete within" not in text, text
    _, ended = log_times(log)
    figures(f"preflight failure ({mode})", fault_to_job_end_s=round(ended.timestamp() - float(faulted_at), 1))


def test_the_fault_hook_leaves_every_node_answering(slurm_cluster):
    """After the tests above, no node is left without its interface: later tests keep every node."""
    for i in slurm_cluster.spec.node_indices:
        link = subprocess.run(
            ["ip", "netns", "exec", slurm_cluster.spec.netns(i), "ip", "-o", "link", "show", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "state UP" in link or ",UP" in link, link
