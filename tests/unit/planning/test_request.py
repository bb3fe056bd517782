"""Rule resources -> JobRequest: every bad value is refused with rule, field, value and what is allowed; every key is
known, mapped or refused; durations and sizes mean what Snakemake makes of them; slurm_extra is read as sbatch
reads it.
The tests that start processes: tests/process/planning/test_request.py."""

from __future__ import annotations

import random

import pytest
import yaml

from snakemake_executor_multinode.planning.request import KNOWN_RESOURCES, RequestError, build_request
from snakemake_executor_multinode.session import Settings
from snakemake_executor_multinode.slurm.sbatch_flags import (
    TABLES,
    table_for,
)
from snakemake_executor_multinode.util.units import parse_mem_mb, parse_runtime
from tests.helpers import REPO
from tests.helpers import refusal_of as refused
from tests.helpers import request_for as req

OFFICIAL_PROFILE = REPO / "tests" / "official_profile" / "config.yaml"


def test_gpus_are_per_node_and_each_node_runs_one_task():
    r = req(nodes=2, gpus=8, cpus_per_task=64)
    assert (r.nodes, r.gpus, r.cpus_per_task, r.omp_threads) == (2, 8, 64, 8)


def test_official_slurm_plugin_resource_names_carry_over():
    r = req(
        slurm_partition="gpu_A6000",
        slurm_account="acct",
        runtime="14d",
        mem_mb=400000,
        constraint="a100&ib",
        qos="high",
        slurm_extra="--mail-type=END",
    )
    assert (r.partition, r.account, r.runtime_min, r.mem_mb) == ("gpu_A6000", "acct", 20160, 400000)
    assert (r.constraint, r.qos, r.slurm_extra) == ("a100&ib", "high", ("--mail-type=END",))


def test_plugin_defaults_fill_what_the_rule_leaves_out():
    r = build_request(
        "x", {"gpus": 1}, defaults=Settings(account="a", partition="p", signal="USR2@300", reservation="maint")
    )
    assert (r.account, r.partition, r.signal, r.reservation) == ("a", "p", "USR2@300", "maint")
    assert build_request("x", {"gpus": 1, "signal": "none"}).signal is None


def test_the_pre_time_limit_signal_goes_to_training_jobs_only():
    assert build_request("x", {"nodes": 2}).signal == "USR2@120"
    assert build_request("x", {"gpus": 1}).signal == "USR2@120"
    assert build_request("x", {}).signal is None  # USR2 would only end a plain command early
    assert build_request("x", {"signal": "USR1@60"}).signal == "USR1@60"


# --- every key is known, mapped or refused ----------------------------------------------------------------------


def test_snakemakes_own_resources_are_allowed():
    """What job.resources holds in the executor (snakemake 9.27, full default resources) is all accepted."""
    r = req(
        mem_mb=8000,
        mem="8 GB",
        mem_mib=7630,
        disk_mb=50000,
        disk="50 GB",
        disk_mib=47684,
        tmpdir="/tmp",
        runtime=30,
        threads=4,
        _cores=4,
        _nodes=1,
        _anything_private="x",
    )
    assert (r.mem_mb, r.runtime_min) == (8000, 30)


@pytest.mark.parametrize(
    "key,suggestion",
    [
        ("gpus_per_node", "did you mean gpus?"),
        ("node", "did you mean nodes"),
        ("partition", "did you mean slurm_partition?"),
        ("mem_per_cpu", "did you mean mem_mb_per_cpu?"),
        ("cpu_per_task", "did you mean cpus_per_task"),
        ("walltime", "did you mean runtime?"),
        ("reservation", "did you mean slurm_reservation?"),
    ],
)
def test_an_unknown_key_is_refused_naming_close_matches(key, suggestion):
    message = refused({key: 8})
    assert message.startswith(f"rule 'train': resource {key}=8 is invalid: unknown resource {key}; {suggestion}")
    assert "(known: " in message and "gpus, " in message and "slurm_partition" in message


def test_unknown_keys_can_be_allowed_with_one_warning():
    r = build_request("x", {"gpus_per_node": 8, "foo": 1}, defaults=Settings(allow_unknown_resources=True))
    assert r.gpus == 0
    assert len(r.warnings) == 1 and "unknown resource(s) foo, gpus_per_node ignored" in r.warnings[0]
    # refused keys stay refused: allowing unknown keys does not make a known meaning go away
    assert "multi-cluster" in refused({"clusters": "c2", "foo": 1}, defaults=Settings(allow_unknown_resources=True))


def test_every_documented_resource_is_in_docs_resources_md():
    doc = (REPO / "docs" / "resources.md").read_text()
    missing = [k for k in KNOWN_RESOURCES if not k.startswith("_") and f"`{k}`" not in doc]
    assert not missing, missing


# --- the official plugin's resources: mapped, or refused with the alternative -----------------------------------

MAPPED = [
    # gpu is GPUs for the whole job (official meaning); gpus is per node
    ({"gpu": 4}, {"gpus": 4, "nodes": 1}),
    ({"gpu": 16, "nodes": 2}, {"gpus": 8, "nodes": 2, "cpus_per_task": 8}),
    ({"gpu": 16, "nodes": 2, "gpus": 8}, {"gpus": 8}),  # both given and agreeing
    ({"gpu": 2, "gpu_model": "a100"}, {"gpus": 2, "gpu_type": "a100"}),
    ({"gpus": 2, "gpu_model": "a100", "gpu_type": "a100"}, {"gpus": 2, "gpu_type": "a100"}),
    # gres counts per node, as --gres does
    ({"gres": "gpu:a100:4", "nodes": 2}, {"gpus": 4, "gpu_type": "a100"}),
    ({"gres": "gpu:8"}, {"gpus": 8, "gpu_type": None}),
    ({"gres": "gpu"}, {"gpus": 1}),
    ({"gres": "gpu:h100"}, {"gpus": 1, "gpu_type": "h100"}),
    ({"gres": "gpu:nvidia_a100-sxm4-80gb:8", "gpus": 8}, {"gpus": 8, "gpu_type": "nvidia_a100-sxm4-80gb"}),
    # cpus_per_gpu: the one task per node holds all the node's GPUs
    ({"gpus": 8, "cpus_per_gpu": 8}, {"cpus_per_task": 64, "omp_threads": 8}),
    ({"gpus": 8, "cpus_per_gpu": 8, "cpus_per_task": 64}, {"cpus_per_task": 64}),
    ({"gpus": 2, "cpus_per_gpu": 0}, {"cpus_per_task": 2}),  # official: 0 or less is "not set"
    ({"cpus_per_gpu": 4}, {"cpus_per_task": 1}),  # official: only for GPU jobs
    # one task per node: these say so already
    ({"tasks": 2, "nodes": 2}, {"nodes": 2}),
    ({"tasks": 1}, {"nodes": 1}),
    ({"tasks_per_node": 1, "nodes": 4}, {"nodes": 4}),
    ({"tasks_per_gpu": 0, "gpus": 1}, {"gpus": 1}),
    ({"mpi": False}, {"nodes": 1}),
    ({"mpi": ""}, {"nodes": 1}),
    # ours, new
    ({"slurm_reservation": "maint_2024"}, {"reservation": "maint_2024"}),
    ({"slurm_partition": "gpu_a,gpu_b"}, {"partition": "gpu_a,gpu_b"}),
    # mem / mem_mib as Snakemake turns them into mem_mb (a preview sees them raw)
    ({"mem": "8GB"}, {"mem_mb": 8000}),
    ({"mem": "8 GiB"}, {"mem_mb": 8590}),
    ({"mem": 16000}, {"mem_mb": 16000}),
    ({"mem_mib": 4000}, {"mem_mb": 4194}),
    ({"mem_mb": 1000, "mem": "1 GB", "mem_mib": 954}, {"mem_mb": 1000}),  # the executor's view: mem_mb wins
    ({"mem_mb": 8000, "mem_mb_per_cpu": 2000}, {"mem_mb": None, "mem_mb_per_cpu": 2000}),  # as the official plugin
]


@pytest.mark.parametrize("resources,expected", MAPPED, ids=[str(m[0]) for m in MAPPED])
def test_official_resources_map_onto_ours(resources, expected):
    r = req(**resources)
    assert {k: getattr(r, k) for k in expected} == expected


def test_gpu_per_job_on_several_nodes_says_what_it_became():
    r = req(gpu=16, nodes=2)
    assert r.warnings == ("rule 'train': gpu=16 is per job (official plugin's meaning) -> gpus=8 per node on 2 nodes",)
    assert req(gpu=4).warnings == ()


ONE_TASK = "the launcher runs one task (one torchrun) per node"
REFUSED = [
    # (resources, field, expected substring)
    ({"gpu": 3, "nodes": 2}, "gpu", "must split evenly over nodes=2; use a multiple of 2, or gpus=N (GPUs per node)"),
    ({"gpu": 8, "gpus": 8, "nodes": 2}, "gpu", "disagrees with gpus=8 (8 per node); gpu means per job: 4 per node"),
    ({"gres": "gpu:4", "gpus": 8}, "gres", "disagrees with gpus=8 (8 per node); gres means 4 per node"),
    ({"gres": "gpu:a100:2", "gpu_type": "h100"}, "gpu_type", "disagrees with gres='gpu:a100:2'"),
    ({"gpu": 2, "gpu_model": "a100", "gpu_type": "v100"}, "gpu_model", "disagrees with gpu_type='v100'"),
    ({"gpu_model": "a100"}, "gpu_model", "needs a GPU count: gpu=N (GPUs for the whole job) or gpus=N (per node)"),
    ({"gres": "nvme:1"}, "gres", "only GPUs: gpu, gpu:N or gpu:TYPE:N (N GPUs per node"),
    ({"gres": "gpu:2,nvme:1"}, "gres", "other generic resources are not supported"),
    ({"gres": "gpu:a100:2G"}, "gres", "only GPUs"),
    ({"gpu": "two"}, "gpu", "GPUs for the whole job"),
    ({"gpus": 8, "cpus_per_gpu": 8, "cpus_per_task": 32}, "cpus_per_gpu", "is cpus_per_task=64 (one task per node)"),
    (
        {"tasks": 16, "nodes": 2},
        "tasks",
        f"must equal nodes=2 or be left out: {ONE_TASK}; for 8 processes per node "
        "set gpus=8 (torchrun starts one per GPU) or pass --nproc_per_node=8 to `multinode torchrun`",
    ),
    ({"tasks": 1, "nodes": 2}, "tasks", "must equal nodes=2"),
    (
        {"tasks_per_node": 8},
        "tasks_per_node",
        f"must be 1 or left out: {ONE_TASK}; for 8 processes per node set gpus=8",
    ),
    ({"tasks_per_gpu": 1, "gpus": 1}, "tasks_per_gpu", "torchrun already starts one process per GPU"),
    ({"mpi": "srun"}, "mpi", "`multinode torchrun` in the shell command starts one torchrun per node"),
    ({"clusters": "c2"}, "clusters", "multi-cluster submission is not supported"),
    ({"cluster": "c2"}, "cluster", "multi-cluster submission is not supported"),
    ({"slurm_cluster": "c2"}, "slurm_cluster", "multi-cluster submission is not supported"),
    ({"slurm_requeue": True}, "slurm_requeue", "set --multinode-max-requeues"),
    ({"gpu_manufacturer": "nvidia"}, "gpu_manufacturer", "use gpu_type (e.g. a100) or constraint"),
    ({"slurm_reservation": "x;y"}, "slurm_reservation", "a SLURM name"),
    ({"mem": "lots"}, "mem", "a size as Snakemake reads it"),
    ({"mem_mb": "8GB"}, "mem_mb", "for a unit use mem, e.g. mem='8GB'"),
]


@pytest.mark.parametrize("resources,field,expected", REFUSED, ids=[f"{r[1]}:{r[0]}" for r in REFUSED])
def test_official_resources_we_cannot_honour_are_refused_with_the_alternative(resources, field, expected):
    message = refused(resources)
    assert message.startswith(f"rule 'train': resource {field}={resources[field]!r} is invalid: ")
    assert expected in message


# --- runtime: Snakemake's own rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,minutes",
    [
        (90, 90),
        ("90", 90),
        ("2h", 120),
        ("1.5h", 90),
        ("1d", 1440),
        ("14d", 20160),
        ("2 days", 2880),
        ("2 Days", 2880),
        ("90min", 90),
        ("30m", 30),
        ("30 minutes", 30),
        ("1w", 10080),
        ("45s", 1),  # whole minutes, rounded down, at least 1 (Snakemake)
        ("150s", 2),
        ("'2h'", 120),  # quotes from a profile are stripped
        (1.5, 2),  # floats rounded (to even), as Snakemake does
        (90.4, 90),
    ],
)
def test_runtime_accepts_minutes_and_durations(value, minutes):
    assert parse_runtime(value) == minutes


RUNTIME_REFUSED = [
    ("soon", ""),
    (-5, ""),
    (0, ""),
    (0.5, ""),  # Snakemake rounds it to 0
    ("1-12:00:00", "'1-12:00:00' is SLURM's time form, which Snakemake refuses: write 2160 or '36h'"),
    ("12:00:00", "write 720 or '12h'"),
    ("10:30", "write 11"),
    ("1h30m", "'1h30m' is more than one unit, which Snakemake refuses: write 90"),
    ("2d 12h", "write 3600 or '60h'"),
    ("-5m", ""),
]


@pytest.mark.parametrize("value,hint", RUNTIME_REFUSED)
def test_runtime_snakemake_refuses_is_refused_saying_what_to_write(value, hint):
    message = refused({"runtime": value})
    assert "minutes (int) or a duration as Snakemake reads it" in message and hint in message


def test_a_runtime_read_as_seconds_is_reported():
    r = req(runtime="90.5")
    assert r.runtime_min == 1 and "Snakemake reads it as seconds -> 1 min" in r.warnings[0]


def _snakemake_value(name, value):
    from snakemake.resources import Resource

    try:
        return Resource(name, value).value
    except Exception:
        return None


RUNTIME_TABLE = [
    90, 1.5, 2.5, 0.4, 0, "0", "90", "2h", "2h ", " 2h", "1.5h", "2 days", "2d", "2D", "1h30m", "90min", "90 min",
    "90mins", "45s", "150s", "0s", "1.5", "90 ", "2.9m", "1w", "1y", "3 weeks", "1 hour", "2 hours", "1e3", "-5m",
    "1-12:00:00", "12:00:00", "10:30", "'2h'", '"90"', "2 h x", "h2", "", "2..5h", "1.5.3h", "100ms", "5000ms",
    "2 fortnights", "1 minute", "0.5d", "٣", "3ｈ",
]  # fmt: skip


@pytest.mark.parametrize("value", RUNTIME_TABLE, ids=[repr(v) for v in RUNTIME_TABLE])
def test_runtime_agrees_with_snakemake(value):
    pytest.importorskip("snakemake")
    theirs = _snakemake_value("runtime", value)
    try:
        ours = parse_runtime(value)
    except ValueError:
        ours = None
    # Snakemake lets 0 through; a job needs a positive time limit, so ours refuses it
    assert ours == (theirs if isinstance(theirs, int) and theirs > 0 else None)


def test_runtime_and_mem_agree_with_snakemake_on_random_strings():
    pytest.importorskip("snakemake")
    rng = random.Random(20240601)
    words = ["s", "m", "min", "h", "d", "w", "day", "days", "hours", "ms", "GB", "MB", "gib", "k", "T", "b", "x"]
    for _ in range(3000):
        parts = [rng.choice(["", " "]), str(rng.randint(0, 3000))]
        if rng.random() < 0.3:
            parts.append("." + str(rng.randint(0, 99)))
        parts += [rng.choice(["", " "]), rng.choice(words + [""]), rng.choice(["", " ", "'"])]
        text = "".join(parts)
        for name, ours_fn in (("runtime", parse_runtime), ("mem", parse_mem_mb)):
            theirs = _snakemake_value(name, text)
            try:
                ours = ours_fn(text)
            except ValueError:
                ours = None
            assert ours == (theirs if isinstance(theirs, int) and theirs > 0 else None), (name, text)


MEM_TABLE = ["8GB", "8 GB", "8gb", "8G", "8 GiB", "500MB", "500 MiB", "1.5TB", "1000", "1000 ", "12345678 b", "8 gigs",
             "1 kb", "lots", "8 XB", "", "0", "0.5", "'8GB'", 8000, 7999.6]  # fmt: skip


@pytest.mark.parametrize("value", MEM_TABLE, ids=[repr(v) for v in MEM_TABLE])
def test_mem_agrees_with_snakemake(value):
    pytest.importorskip("snakemake")
    theirs = _snakemake_value("mem", value)
    try:
        ours = parse_mem_mb(value)
    except ValueError:
        ours = None
    assert ours == (theirs if isinstance(theirs, int) and theirs > 0 else None)


# --- slurm_extra: read as sbatch reads it ------------------------------------------------------------------------

EXTRA_OK = [
    ("--mail-type=END", ("--mail-type=END",)),
    ("--mail-type END --mail-user=me@example.org", ("--mail-type=END", "--mail-user=me@example.org")),
    ("--mail-t=END", ("--mail-type=END",)),  # a unique prefix is the option
    ("--exclusiv", ("--exclusive",)),
    ("--exclusive=user", ("--exclusive=user",)),
    ("-Hv", ("--hold", "--verbose")),  # bundled short options
    ("-L matlab:1", ("--licenses=matlab:1",)),
    ("-Lmatlab:1", ("--licenses=matlab:1",)),
    ("--nice", ("--nice",)),
    ("--begin=now+1hour --deadline=2030-01-01", ("--begin=now+1hour", "--deadline=2030-01-01")),
    ("--mail-user='a b@example.org'", ("--mail-user=a b@example.org",)),
    ("--prefer=a100", ("--prefer=a100",)),
    ("--gres-flags=enforce-binding", ("--gres-flags=enforce-binding",)),
]


@pytest.mark.parametrize("value,tokens", EXTRA_OK)
def test_slurm_extra_is_read_as_sbatch_reads_it(value, tokens):
    assert req(slurm_extra=value).slurm_extra == tokens


EXTRA_REFUSED = [
    ("--nodes=4", "--nodes is managed by the plugin; set it with nodes instead"),
    ("--gres=gpu:2", "set it with gpus"),
    ("-t 10", "-t (= --time) is managed by the plugin; set it with runtime"),
    ("-N2", "-N (= --nodes) is managed by the plugin; set it with nodes"),
    ("-vN3", "-N (= --nodes) is managed by the plugin; set it with nodes"),
    ("--outp=x", "--outp (= --output) is managed by the plugin; the plugin writes the log"),
    ("--cpus-per-tas=3", "--cpus-per-tas (= --cpus-per-task) is managed by the plugin; set it with cpus_per_task"),
    (
        "--ntasks-per-node=8",
        f"--ntasks-per-node is managed by the plugin; {ONE_TASK}; for 8 processes per node set "
        "gpus=8 (torchrun starts one per GPU) or pass --nproc_per_node=8 to `multinode torchrun`",
    ),
    ("--tasks-per-node=4", "for 4 processes per node set gpus=4"),
    ("-n 16", f"-n (= --ntasks) is managed by the plugin; {ONE_TASK}; for N processes per node"),
    ("--ntasks-per-gpu=1", ONE_TASK),
    ("--gpus-per-node=8", "set it with gpus"),
    ("--mem-per-gpu=10G", "set it with mem_mb"),
    ("--cpus-per-gpu=8", "set it with cpus_per_gpu"),
    ("--reservation=maint", "set it with slurm_reservation"),
    ("--qos=high", "set it with qos"),
    ("-M c2", "multi-cluster submission is not supported"),
    ("--array=1-10", "array jobs are not supported"),
    ("--wait", "--wait would block it"),
    ("--test-only", "submits nothing"),
    ("--requeue", "--multinode-max-requeues"),
    ("-d afterok:1", "dependencies are the plugin's"),
    ("--export=NONE", "--export=ALL"),
    ("--wrap=true", "the plugin writes the job script"),
    ("--mem-per=1", "--mem-per is ambiguous to sbatch: --mem-per-cpu, --mem-per-gpu"),
    ("--ntasks-per=2", "is ambiguous to sbatch"),
    ("--xyz", "--xyz is not an sbatch option (sbatch 22.05 or 24.11)"),
    ("--mail-tipe=END", "did you mean --mail-type"),
    ("-y", "-y is not an sbatch option"),
    ("--mail-type", "--mail-type needs a value"),
    ("-L", "-L (--licenses) needs a value"),
    ("--parsable=x", "--parsable takes no value"),
    ("--hold=1", "--hold takes no value"),
    ("-exclusive", "sbatch reads -exclusive as -e xclusive; write --exclusive (two dashes)"),
    ("script.sh", "'script.sh' is not an option: only sbatch flags may follow"),
    ("--nice 5", "'5' is not an option"),  # an optional value needs '='
    ("--hold -- --x", "'--' is not an option"),
    ("--mail-type=END\n--nodes=2", "control character '\\n': it must be one line of sbatch flags"),
    ("--mail-type=END\r", "control character '\\r'"),
    ("--comment=\x1b[31m", "control character '\\x1b'"),
    ("--output 'x", "must be shell-style flags"),
]


@pytest.mark.parametrize("value,expected", EXTRA_REFUSED)
def test_slurm_extra_refuses_what_sbatch_refuses_and_what_the_plugin_manages(value, expected):
    message = refused({"slurm_extra": value})
    assert message.startswith(f"rule 'train': resource slurm_extra={value!r} is invalid: ")
    assert expected in message


@pytest.mark.parametrize("release", [*TABLES, None])
def test_every_managed_long_option_is_refused_by_every_unique_prefix(release):
    """In each release's table (and, with no release known, in every option any release has): --res is --reservation
    to sbatch 22.05 and ambiguous to 24.11 (--resv-ports)."""
    from snakemake_executor_multinode.planning.request import MANAGED_FLAGS

    table = table_for(release)
    for flag in (f for f in MANAGED_FLAGS if f.startswith("--")):
        name = flag[2:]
        for end in range(1, len(name) + 1):
            prefix = name[:end]
            matches = [n for n in table.long if n.startswith(prefix)]
            if matches == [name] or prefix == name:
                value = f"--{prefix}" + ("=1" if table.long[name] == "required" else "")
                assert "is managed by the plugin" in refused({"slurm_extra": value}, sbatch_options=table), value


def test_the_release_found_picks_the_table_and_an_option_it_lacks_is_refused_naming_it():
    assert table_for("24.11.5").long is TABLES["24.11"].long and table_for("22.05.8").long is TABLES["22.05"].long
    extra = {"slurm_extra": "--segment=2"}  # 24.11: jobs in segments of a topology/block cluster
    assert build_request("train", extra, sbatch_options=table_for("24.11.5")).slurm_extra == ("--segment=2",)
    assert "--segment is not an sbatch option (sbatch 22.05.8)" in refused(extra, sbatch_options=table_for("22.05.8"))
    # --power went in 24.11
    assert "--power is not an sbatch option (sbatch 24.11.5)" in refused(
        {"slurm_extra": "--power=level"}, sbatch_options=table_for("24.11.5")
    )
    # a release without a table of its own: every option a known release has, and the message names it
    other = table_for("25.05.1")
    assert build_request("train", extra, sbatch_options=other).slurm_extra == ("--segment=2",)
    assert "(sbatch 22.05 or 24.11; this cluster's is 25.05.1)" in refused(
        {"slurm_extra": "--xyz"}, sbatch_options=other
    )


# --- the official plugin's profile, rule by rule -------------------------------------------------------------------

# rule -> the JobRequest fields it maps to, or (field, substring of the refusal)
PROFILE_EXPECTED = {
    "fastqc": {
        "partition": "standard",
        "account": "my_account",
        "runtime_min": 120,
        "mem_mb": 8000,
        "cpus_per_task": 4,
        "slurm_extra": ("--mail-type=FAIL", "--mail-user=me@example.org"),
    },
    "call_variants": {"runtime_min": 2880, "mem_mb": 64000, "constraint": "avx512", "slurm_extra": ("--exclusive",)},
    "sort_bam": {"mem_mb": None, "mem_mb_per_cpu": 4000, "cpus_per_task": 8, "nodes": 1},
    "long_haul": {"partition": "long", "qos": "long", "runtime_min": 20160},
    "train_gpu": {
        "nodes": 2,
        "gpus": 8,
        "gpu_type": "a100",
        "cpus_per_task": 64,
        "mem_mb": 400000,
        "runtime_min": 4320,
    },
    "predict_gres": {"partition": "gpu", "gpus": 2, "gpu_type": "a100", "cpus_per_task": 8, "runtime_min": 30},
    "odd_gpu_split": ("gpu", "must split evenly over nodes=2"),
    "mpi_sim": ("tasks", f"must equal nodes=1 or be left out: {ONE_TASK}; for 64 processes per node"),
    "hybrid_mpi": ("tasks_per_node", f"must be 1 or left out: {ONE_TASK}; for 4 processes per node set gpus=4"),
    "extra_tasks": ("slurm_extra", f"--ntasks-per-node is managed by the plugin; {ONE_TASK}; for 8 processes"),
    "other_cluster": ("clusters", "multi-cluster submission is not supported"),
    "local_nvme": ("gres", "other generic resources are not supported"),
    "slurm_time": ("runtime", "write 2160 or '36h'"),
    "typo": ("mem_per_cpu", "unknown resource mem_per_cpu; did you mean mem_mb_per_cpu?"),
}


def _profile():
    return yaml.safe_load(OFFICIAL_PROFILE.read_text())


def _plain(rule: str) -> dict:
    """The rule's resources as plain YAML gives them (what `multinode preview` would be handed): the defaults, then the
    rule's own; a mem given in either form replaces the defaults' (Snakemake keeps one of mem/mem_mb/mem_mib)."""
    profile = _profile()
    own = profile["set-resources"][rule]
    merged = dict(profile["default-resources"])
    if {"mem", "mem_mb", "mem_mib"} & set(own):
        for key in ("mem", "mem_mb", "mem_mib"):
            merged.pop(key, None)
    return merged | own


def _as_the_executor_sees(rule: str):
    """The rule's job.resources as Snakemake 9 builds them from this profile (its own profile parser, its own
    --default-resources/--set-resources parsing and evaluation), minus the _cores/_nodes the adapter drops."""
    from snakemake.cli import parse_set_resources
    from snakemake.profiles import ProfileConfigFileParser
    from snakemake.resources import Resources

    with OFFICIAL_PROFILE.open() as f:
        parsed = ProfileConfigFileParser().parse(f)
    resources = Resources.parse(parsed["default-resources"], allow_expressions=True, defaults="full")
    resources.update(parse_set_resources(parsed["set-resources"])[rule])

    def evaluate(res):
        return res.evaluate(wildcards={}, input=[], attempt=1, threads=1, rulename=rule, async_run=None)

    return {k: v for k, v in resources.expand_items(constraints={}, evaluate=evaluate) if v is not None}


def _outcome(rule: str, resources: dict):
    try:
        return build_request(rule, resources)
    except RequestError as err:
        return err


def test_the_official_profile_covers_every_rule_we_expect():
    assert _profile()["executor"] == "slurm"
    assert set(_profile()["set-resources"]) == set(PROFILE_EXPECTED)


@pytest.mark.parametrize("rule", sorted(PROFILE_EXPECTED))
def test_official_profile(rule):
    expected = PROFILE_EXPECTED[rule]
    plain = _outcome(rule, _plain(rule))
    if isinstance(expected, tuple):
        field, substring = expected
        assert isinstance(plain, RequestError), plain
        assert (plain.field, substring in str(plain)) == (field, True), str(plain)
    else:
        assert isinstance(plain, type(build_request("x", {}))), plain
        assert {k: getattr(plain, k) for k in expected} == expected

    # The executor sees what Snakemake made of the profile: the same request, or the same refusal (or Snakemake's own)
    pytest.importorskip("snakemake")
    try:
        seen = _as_the_executor_sees(rule)
    except Exception as err:  # Snakemake refuses it before any executor sees it
        assert isinstance(plain, RequestError) and plain.field == "runtime", err
        return
    executor = _outcome(rule, seen)
    if isinstance(plain, RequestError):
        assert isinstance(executor, RequestError) and executor.field == plain.field, executor
    else:
        assert executor == plain


# --- the existing table of bad input ----------------------------------------------------------------------------

BAD = [
    ({"nodes": 0}, "nodes", "a positive integer"),
    ({"nodes": "two"}, "nodes", "a positive integer"),
    ({"nodes": 1.5}, "nodes", "a positive integer"),
    ({"gpus": -1}, "gpus", "a non-negative integer"),
    ({"gpus": "4x"}, "gpus", "a non-negative integer"),
    ({"gpus": 8, "cpus_per_task": 4}, "cpus_per_task", "must be at least gpus=8"),
    ({"runtime": "soon"}, "runtime", "minutes (int) or a duration"),
    ({"runtime": -5}, "runtime", "minutes (int) or a duration"),
    ({"slurm_extra": "--nodes=4"}, "slurm_extra", "--nodes is managed by the plugin; set it with nodes"),
    ({"slurm_extra": "--gres=gpu:2"}, "slurm_extra", "set it with gpus"),
    ({"slurm_extra": "-t 10"}, "slurm_extra", "set it with runtime"),
    ({"slurm_extra": "-N2"}, "slurm_extra", "set it with nodes"),
    ({"slurm_extra": "--output 'x"}, "slurm_extra", "must be shell-style flags"),
    ({"signal": "USR2; rm -rf /"}, "signal", "SLURM's --signal form"),
    ({"slurm_partition": "gpu; reboot"}, "slurm_partition", "a SLURM name"),
    ({"nodelist": "node1 $(id)"}, "nodelist", "a host list"),
    ({"master_port": 80}, "master_port", "1024..65535"),
    ({"gpu_flag": "gpus"}, "gpu_flag", "'gres' or 'gpus-per-node'"),
    ({"gpu_type": "a100:x"}, "gpu_type", "a GPU type as in gres"),
]


@pytest.mark.parametrize("resources,field,allowed", BAD, ids=[f"{b[1]}={list(b[0].values())[-1]}" for b in BAD])
def test_bad_input_names_rule_field_value_and_what_is_allowed(resources, field, allowed):
    with pytest.raises(RequestError) as err:
        req(**resources)
    message = str(err.value)
    assert message.startswith(f"rule 'train': resource {field}=")
    assert allowed in message
    assert repr(resources[field]) in message


def test_a_capped_nodes_resource_is_reported():
    r = build_request("train", {"nodes": 1}, declared_nodes=4)
    assert "asks for nodes=4 but gets 1" in r.warnings[0] and "--resources nodes" in r.warnings[0]


def test_a_signal_lead_as_long_as_the_runtime_is_reported():
    r = build_request("train", {"gpus": 1, "runtime": 2})
    assert "arrives within 30 s of every start" in r.warnings[0]
    assert build_request("train", {"gpus": 1, "runtime": 10}).warnings == ()
