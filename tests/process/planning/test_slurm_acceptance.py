"""SLURM asked before the first submission (slurm_acceptance.ask_slurm): one `sbatch --test-only` per resource shape,
SLURM's refusals turned into the field that caused them, the account checked against the user's associations, the
default partition named.

A fake of SLURM's commands answers with SLURM 22.05's own wording (read off the local cluster); the real cluster is
asked in test_check_cluster.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from snakemake_executor_multinode.planning import slurm_acceptance
from snakemake_executor_multinode.planning.plan import Planner, RuleJob, plan_job
from snakemake_executor_multinode.session import Settings
from snakemake_executor_multinode.slurm.client import SlurmClient, SubmitError
from tests.helpers import Answer, FakeSlurm

TORCHRUN = "multinode torchrun train.py"  # the rule's shell command: it uses every node and GPU (launcher_use.py)
PARTITION = (
    "PartitionName=gpu AllowGroups=ALL Default=YES DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=1-00:00:00 "
    "Nodes=node[1-3] State=UP TotalCPUs=12 TotalNodes=3"
)
NODE = (
    "NodeName=node{i} Arch=x86_64 CPUTot=4 Gres={gres} OS=Linux 6.1 #1 SMP PREEMPT_DYNAMIC RealMemory=64000 "
    "State=IDLE Partitions=gpu"
)
NODES = "\n".join(NODE.format(i=i, gres="gpu:8") for i in (1, 2, 3))
OK = (0, "", "sbatch: Job 42 to start at 2026-01-01T00:00:00 using 1 processors on nodes node1 in partition gpu\n")


def refused(reason: str, first: str = "") -> tuple[int, str, str]:
    return 1, "", (first + "\n" if first else "") + f"allocation failure: {reason}\n"


def slurm(
    sbatch: Callable[[str], Answer] | None = None, assoc: Answer = (0, "root|\n", ""), nodes: str = NODES
) -> FakeSlurm:
    """sbatch --test-only answers by what the script asks; scontrol and sacctmgr from fixed text."""
    by_script = sbatch or (lambda script: OK)

    def sbatch_answer(cmd: list[str]) -> Answer:
        return (
            (0, "slurm-wlm 22.05.8\n", "") if cmd == ["sbatch", "--version"] else by_script(Path(cmd[-1]).read_text())
        )

    def scontrol(cmd: list[str]) -> Answer:
        if cmd[:4] == ["scontrol", "-o", "show", "partition"]:
            return 0, PARTITION + "\n", ""
        if cmd[:4] == ["scontrol", "-o", "show", "node"]:
            return 0, nodes + "\n", ""
        raise AssertionError(f"unexpected command {cmd}")

    return FakeSlurm(None, sbatch=sbatch_answer, scontrol=scontrol, sacctmgr=assoc)


def planned(tmp_path: Path, rule: str = "train", settings: Settings | None = None, wildcards=None, **resources):
    plan = plan_job(
        RuleJob(rule, resources, "true", wildcards=wildcards or {}, key=f"{rule}{wildcards}", shellcmd=TORCHRUN),
        Planner(settings or Settings(), tmp_path, "run1"),
    )
    return slurm_acceptance.Planned(plan, frozenset(resources))


def asked(fake: FakeSlurm, *jobs: slurm_acceptance.Planned) -> slurm_acceptance.Report:
    return slurm_acceptance.ask_slurm(list(jobs), SlurmClient(runner=fake), user="root")


def test_one_test_only_per_resource_shape(tmp_path):
    fake = slurm()
    jobs = [planned(tmp_path, "prep", wildcards={"shard": str(i)}, runtime=10, slurm_partition="gpu") for i in range(4)]
    jobs += [planned(tmp_path, "merge", runtime=10, slurm_partition="gpu")]  # same shape, another rule
    jobs += [planned(tmp_path, "train", nodes=2, gpus=2, cpus_per_task=2, slurm_partition="gpu")]
    assert len({slurm_acceptance.shape(j.plan) for j in jobs}) == 2
    report = asked(fake, *jobs)
    assert report.tests == fake.count("sbatch", "--test-only") == 2
    assert report.errors == report.warnings == [] and report.unreachable is None
    assert fake.count("scontrol") == fake.count("sacctmgr") == 0  # nothing else to ask: partitions named, no account


def test_the_default_partition_is_read_from_the_answer_without_asking_scontrol(tmp_path):
    """A job that names no partition: SLURM's answer to its --test-only says where it would run, so naming the default
    partition costs no `scontrol show partition` (a controller RPC per run)."""
    fake = slurm(sbatch=lambda s: (0, "", OK[2].replace("partition gpu", "partition main")))
    report = asked(fake, planned(tmp_path, "up"))
    assert report.default_partition == "main"  # the answer's, not scontrol's ('gpu')
    assert report.warnings == [
        "rule 'up': no partition (resource slurm_partition or --multinode-partition): SLURM uses its default "
        "partition 'main'"
    ]
    assert fake.count("scontrol") == 0
    report = asked(slurm(sbatch=lambda s: (0, "", "sbatch: Job 42 to start soon\n")), planned(tmp_path, "up"))
    assert report.default_partition == "gpu"  # an answer that names none: scontrol is asked


def test_the_shape_leaves_out_only_job_name_comment_and_log(tmp_path):
    a = planned(tmp_path, "r", wildcards={"x": "1"}, runtime=10).plan
    b = planned(tmp_path, "r", wildcards={"x": "2"}, runtime=10).plan
    c = planned(tmp_path, "r", wildcards={"x": "1"}, runtime=11).plan
    assert slurm_acceptance.shape(a) == slurm_acceptance.shape(b) != slurm_acceptance.shape(c)
    assert not any(flag in " ".join(slurm_acceptance.shape(a)) for flag in ("--job-name", "--comment", "--output"))
    assert "#SBATCH --time=10" in slurm_acceptance.shape(a)


def test_too_many_nodes_names_the_field_and_the_partition_size(tmp_path):
    fake = slurm(sbatch=lambda s: refused("Node count specification invalid") if "--nodes=5" in s else OK)
    report = asked(fake, planned(tmp_path, "up"), planned(tmp_path, "big", nodes=5))
    assert report.errors == [
        "rule 'big': resource nodes=5 is invalid: partition 'gpu' has 3 nodes (SLURM: Node count specification invalid)"
    ]
    assert report.default_partition == "gpu"
    assert report.warnings == [
        "rules 'up', 'big': no partition (resource slurm_partition or --multinode-partition): SLURM uses its default "
        "partition 'gpu'"
    ]


def test_a_partition_that_does_not_exist_lists_those_that_do_and_says_where_it_came_from(tmp_path):
    fake = slurm(
        sbatch=lambda s: refused("Invalid partition name specified", "sbatch: error: invalid partition specified: x")
    )
    setting = Settings(partition="x")
    report = asked(fake, planned(tmp_path, "a", settings=setting), planned(tmp_path, "b", settings=setting))
    assert report.errors == [
        "rules 'a', 'b': resource slurm_partition='x' is invalid: no such partition; partitions: gpu; "
        "set by --multinode-partition (SLURM: Invalid partition name specified)"
    ]
    report = asked(fake, planned(tmp_path, "a", slurm_partition="x"))
    assert "set by" not in report.errors[0] and "resource slurm_partition='x'" in report.errors[0]


@pytest.mark.parametrize(
    "resources,reason,expected",
    [
        (
            {"gpus": 9, "cpus_per_task": 9},
            "More processors requested than permitted",
            "resource gpus=9 is invalid: the nodes of partition 'gpu' have at most 8 GPUs each",
        ),
        (
            {"cpus_per_task": 5},
            "Requested node configuration is not available",
            "resource cpus_per_task=5 is invalid: the nodes of partition 'gpu' have at most 4 CPUs each",
        ),
        (
            {"mem_mb": 70000},
            "Requested node configuration is not available",
            "resource mem_mb=70000 is invalid: the nodes of partition 'gpu' have at most 64000 MB of memory each",
        ),
        (
            {"gpus": 1, "gpu_type": "a100"},
            "Invalid generic resource (gres) specification",
            "resource gpu_type='a100' is invalid: no node of partition 'gpu' has it; GPU types: untyped",
        ),
        (
            {"runtime": 2000},
            "Requested time limit is invalid (missing or exceeds some limit)",
            "resource runtime=2000 is invalid: partition 'gpu' allows at most 1-00:00:00 (runtime is in minutes)",
        ),
        ({"constraint": "ib"}, "Invalid feature specification", "resource constraint='ib' is invalid"),
        ({"nodelist": "node9"}, "Invalid node name specified", "resource nodelist='node9' is invalid"),
        ({"qos": "fast"}, "Invalid qos specification", "resource qos='fast' is invalid"),
    ],
)
def test_refusals_map_to_the_field(tmp_path, resources, reason, expected):
    fake = slurm(sbatch=lambda s: refused(reason))
    report = asked(fake, planned(tmp_path, "t", slurm_partition="gpu", **resources))
    [error] = report.errors
    assert error.startswith(f"rule 't': {expected}") and error.endswith(f"(SLURM: {reason})")


def test_too_few_nodes_that_fit_is_a_nodes_error(tmp_path):
    nodes = "\n".join(NODE.format(i=i, gres="gpu:8" if i == 1 else "gpu:2") for i in (1, 2, 3))
    fake = slurm(sbatch=lambda s: refused("Requested node configuration is not available"), nodes=nodes)
    report = asked(fake, planned(tmp_path, "t", slurm_partition="gpu", nodes=2, gpus=4, cpus_per_task=4))
    assert report.errors == [
        "rule 't': resource nodes=2 is invalid: only 1 node(s) of partition 'gpu' have 4 GPUs, 4 CPUs each "
        "(SLURM: Requested node configuration is not available)"
    ]


def test_a_refusal_the_configured_nodes_explain_not_is_a_warning_and_an_unknown_one_is_quoted(tmp_path):
    fake = slurm(sbatch=lambda s: refused("Requested node configuration is not available"))
    report = asked(fake, planned(tmp_path, "t", slurm_partition="gpu"))
    assert report.errors == [] and report.warnings == [
        "rule 't': SLURM cannot place the job now (nodes=1, gpus=0, cpus_per_task=1, partition gpu): "
        "Requested node configuration is not available"
    ]
    fake = slurm(sbatch=lambda s: refused("Job violates accounting/QOS policy (job submit limit)"))
    report = asked(fake, planned(tmp_path, "t", slurm_partition="gpu"))
    assert report.errors == [
        "rule 't': SLURM refuses the job (nodes=1, gpus=0, cpus_per_task=1, partition gpu): "
        "Job violates accounting/QOS policy (job submit limit)"
    ]


def test_an_account_the_user_cannot_charge_is_an_error(tmp_path):
    fake = slurm(assoc=(0, "root|\nproj|\n", ""))
    report = asked(fake, planned(tmp_path, "t", slurm_partition="gpu", slurm_account="nosuchacct"))
    assert report.errors == [
        "rule 't': resource slurm_account='nosuchacct' is invalid: user 'root' cannot charge it (SLURM accounting); "
        "accounts root can charge: proj, root"
    ]
    assert fake.calls[-1] == [
        "sacctmgr", "-n", "-P", "show", "assoc", "where", "user=root", "format=account,partition"
    ]  # fmt: skip
    assert asked(fake, planned(tmp_path, "t", slurm_partition="gpu", slurm_account="proj")).errors == []
    report = asked(fake, planned(tmp_path, "t", settings=Settings(account="x"), slurm_partition="gpu"))
    assert report.errors[0].endswith("; set by --multinode-account")


def test_an_account_tied_to_other_partitions_is_an_error(tmp_path):
    fake = slurm(assoc=(0, "proj|cpu\nproj|big\n", ""))
    report = asked(fake, planned(tmp_path, "t", slurm_account="proj"))
    assert report.errors[0] == (
        "rule 't': resource slurm_account='proj' is invalid: user 'root' may charge it only in partition(s) big, cpu, "
        "not gpu"
    )


@pytest.mark.parametrize(
    "assoc",
    [(0, "", ""), (1, "", "sacctmgr: error: Problem talking to the database: Connection refused")],
    ids=["accounting-does-not-know-the-user", "no-accounting"],
)
def test_no_account_verdict_without_associations(tmp_path, assoc):
    fake = slurm(assoc=assoc)
    assert asked(fake, planned(tmp_path, "t", slurm_partition="gpu", slurm_account="x")).errors == []
    assert fake.count("sacctmgr") == 1  # one attempt: a run never waits for slurmdbd


def test_slurm_out_of_reach_is_reported_once_with_the_slurm_conf_hint_and_nothing_else_is_asked(tmp_path):
    fake = slurm(
        sbatch=lambda s: (1, "", "sbatch: fatal: Could not establish a configuration source"), assoc=(1, "", "")
    )
    report = asked(fake, planned(tmp_path, "a", runtime=1), planned(tmp_path, "b", runtime=2))
    assert report.unreachable == (
        "sbatch: fatal: Could not establish a configuration source\n(no SLURM configuration: set SLURM_CONF, or for "
        'the local sandbox run `eval "$(multinode cluster env)"`)'
    )  # the same hint a run's submission gives
    assert report.errors == [] and report.tests == 1 and fake.count("scontrol") == fake.count("sacctmgr") == 0


def test_the_test_script_is_private_and_gone_afterwards(tmp_path):
    seen = []

    def sbatch(text: str):
        seen.append(text)
        return OK

    fake = slurm(sbatch=sbatch)
    job = planned(tmp_path, "t", slurm_partition="gpu")
    asked(fake, job)
    assert seen == [job.plan.script]
    script = Path(next(c for c in fake.calls if c[:2] == ["sbatch", "--test-only"])[-1])
    assert not script.exists() and not script.parent.exists()


def test_test_only_returns_slurms_answer_and_raises_its_refusal(tmp_path):
    script = tmp_path / "x.sh"
    script.write_text("#!/bin/bash\n")
    answer = SlurmClient(runner=slurm()).test_only(script, tmp_path)
    assert answer.startswith("Job 42 to start at") and answer.endswith("in partition gpu")
    fake = slurm(sbatch=lambda s: refused("Node count specification invalid"))
    with pytest.raises(SubmitError, match="^allocation failure: Node count specification invalid$"):
        SlurmClient(runner=fake).test_only(script, tmp_path)


def test_an_option_this_slurm_release_lacks_names_the_rule_the_field_and_the_release_found(tmp_path):
    """A 24.11 option (--segment) on a 22.05 cluster: sbatch's own word is "unrecognized option"; the error names
    the rule, slurm_extra and the release (sbatch --version), before anything is submitted."""
    fake = slurm(sbatch=lambda script: (255, "", "sbatch: unrecognized option '--segment=1'\nTry \"sbatch --help\""))
    report = asked(fake, planned(tmp_path, slurm_extra="--segment=1"))
    assert report.slurm_version == "22.05.8"
    assert report.errors == [
        "rule 'train': resource slurm_extra='--segment=1' is invalid: SLURM 22.05.8 has no option --segment (an "
        "option of another release? `sbatch --help` lists them)"
    ]
