"""A goodput model (issue 48, part 5): what each fault costs, as goodput.py measured it, put together to predict the
benchmark's goodput, then projected to Llama 3's scale.

    python benchmarks/goodput_model.py [--goodput benchmarks/results-goodput.json]
        [--checkpoint benchmarks/results-checkpoint-async-h100.json]
        [--restore benchmarks/results-checkpoint-verify-h100.json] [--restarts benchmarks/results-restart.json]
        [--out benchmarks/results-goodput-model.json]

The inputs, all measured:
- the fault-free run (goodput.py's `baseline` variant, the same training beside the others): the first run's startup
  S0, the median step time s, the stall per checkpoint c (the ledger's checkpoint seconds over its saves) and the
  teardown T;
- each variant's faults, cut by goodput.py (FaultResult): held (the fault to the end of the run it hit, or to the
  relaunch inside it: the time to detect it), startup (the new run's start to its resume: the time to restart),
  restore (the resume's load), lost (the work since the last checkpoint, computed again), queue (pending between
  runs: not allocated, wall time only);
- the checkpoint stall of a GPT-2-medium-size model on one H100, synchronous and asynchronous
  (benchmarks/checkpoint_cost.py's result), and the restore of the same model there (an earlier run of it that
  resumed: results-checkpoint-verify-h100.json);
- the in-job restarts (benchmarks/restart.py's rounds of the hung- and crashed-rank cluster tests, with the
  defaults): the median time from the fault to the relaunched ranks ready, the same job, no queue. goodput.py's runs
  predate the restarts, so its hang and crash are replaced by these in one projected row, its node death kept.

The benchmark's goodput (productive node-seconds over allocated node-seconds), predicted per variant:

    allocated = N_alloc x (S0 + W + n x c + T + sum over its faults of (held + startup + restore + lost)
                           + sum over its restarts that no fault caused of (teardown + startup + restore))
    productive = N x W,  W = steps x s

(N the training's nodes, N_alloc with the spares, n its checkpoints), beside what the ledger measured.

The projection (a dedicated cluster of Llama 3's size: every second counts, a requeue's queue wait too): faults come
at the measured rate M (mean time between interruptions, 54 days / 419), each of the kind its cause maps to, each
costing its kind's measured downtime D (held + queue + startup + restore: the restore of the GPU-size checkpoint) plus
on average half a checkpoint interval of work; checkpoints every tau = sqrt(2 c M) (Young and Daly, first order),
with c the stall of the save the variant makes. Per unit of time the training then keeps

    goodput = tau / (tau + c) x (1 - (E[D] + (tau + c) / 2) / M) x N / N_alloc

where E[D] is D averaged over the causes' shares. Compared: the seed's recipe and the competent team's (today's
synchronous saves), `--executor multinode` with and without spare nodes (asynchronous saves), and Llama 3's reported
effective training time, "higher than 90%". What the projection cannot see is said with it (LIMITS).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The Llama 3 Herd of Models (Llama Team, AI @ Meta, 2024, arXiv:2407.21783), section 3.3.4 "Reliability and
# operational challenges", Table 5 "Root-cause categorization of unexpected interruptions during a 54-day period of
# Llama 3 405B pre-training": 466 job interruptions, 47 planned, 419 unexpected; "higher than 90% effective training
# time" on up to 16K H100 GPUs (8 per server). The table as reproduced at
# https://glennklockwood.com/garden/component-reliability (its counts sum to 419).
LLAMA3 = {
    "source": "The Llama 3 Herd of Models, arXiv:2407.21783, section 3.3.4, Table 5",
    "gpus": 16384,
    "gpus_per_node": 8,
    "days": 54,
    "effective_training_time": 0.90,  # "higher than 90%"
    "interruptions": {
        "Faulty GPU": 148,
        "GPU HBM3 Memory": 72,
        "Software Bug": 54,
        "Network Switch/Cable": 35,
        "Host Maintenance": 32,
        "GPU SRAM Memory": 19,
        "GPU System Processor": 17,
        "NIC": 7,
        "NCCL Watchdog Timeouts": 7,
        "Silent Data Corruption": 6,
        "GPU Thermal Interface + Sensor": 6,
        "SSD": 3,
        "Power Supply": 3,
        "Server Chassis": 2,
        "IO Expansion Board": 2,
        "Dependency": 2,
        "CPU": 2,
        "System Memory": 2,
    },
}

# Which measured fault each cause behaves as. A part of a node that fails takes the node out of the job: it needs
# another node (node_death). A network part that fails leaves collectives waiting (hang). Software, and corrupted data
# once found, end a process on a node that is fine (crash).
KIND = {
    "Faulty GPU": "node_death",
    "GPU HBM3 Memory": "node_death",
    "Software Bug": "crash",
    "Network Switch/Cable": "hang",
    "Host Maintenance": "node_death",
    "GPU SRAM Memory": "node_death",
    "GPU System Processor": "node_death",
    "NIC": "node_death",
    "NCCL Watchdog Timeouts": "hang",
    "Silent Data Corruption": "crash",
    "GPU Thermal Interface + Sensor": "node_death",
    "SSD": "node_death",
    "Power Supply": "node_death",
    "Server Chassis": "node_death",
    "IO Expansion Board": "node_death",
    "Dependency": "crash",
    "CPU": "node_death",
    "System Memory": "node_death",
}
KINDS = ("node_death", "hang", "crash")

# Projected: (label, goodput.py variant whose faults are measured, save: the stall of synchronous or asynchronous
# saves, spare nodes per job at scale, whether restart.py's in-job restarts replace the variant's hang and crash).
PROJECTED = [
    ("the seed's recipe", "recipe", "sync", 0, False),
    ("the recipe + a competent team", "competent", "sync", 0, False),
    ("`--executor multinode`", "multinode", "async", 0, False),
    ("`--executor multinode`, `spare_nodes=1`", "spares", "async", 1, False),
    ("`--executor multinode`, `spare_nodes=1`, in-job restarts", "spares", "async", 1, True),
]
# restart.py's scenario for each fault kind an in-job restart takes
RESTARTED = {"hang": "hung rank restarted", "crash": "crashed rank restarted"}
GOAL = 0.97

LIMITS = [
    "the recipes' hang is bounded here by the benchmark's 15-minute time limit, their only guard; the seed's own "
    "limit is 14 days (`--time=20160`): there a hung rank holds every node until someone notices",
    "restart at scale: the startup measured here is 2 nodes' (the plugin's checks, torchrun, gloo, a tiny model); "
    "16,384 processes rendezvous, build NCCL communicators and load a 405B model's shards for minutes, not seconds: "
    "every fault pays that once more",
    "the checkpoint stall is one GPU's copy of a 4.9 GB GPT-2-medium state; a 405B model sharded over 16K GPUs holds "
    "less per GPU (Llama 3 saved 1 MB to 4 GB per GPU), so the stall should be no larger, but the shared filesystem's "
    "bandwidth (every GPU writing at once) bounds how soon the next save can start",
    "a hang is noticed by a timeout: the stall watchdog or a collective timeout; its setting is the detection time",
    "the fault kinds are mapped from Table 5's causes, one kind per cause; faults are assumed independent, one at a "
    "time, at a constant rate",
    "spare nodes: a spare replaces one node inside the job; the projection assumes the job's spares are replenished "
    "between faults (about 5 node faults a day at this scale)",
]


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def variants(goodput: dict[str, Any], scenario: str) -> dict[str, dict[str, Any]]:
    return {v["variant"]: v for v in goodput["scenarios"][scenario]["variants"]}


def fault_cost(f: dict[str, Any]) -> float:
    """The allocated seconds (per node) a fault cost in the benchmark: held, startup, restore, lost."""
    return f["held_s"] + f["startup_s"] + f["restore_s"] + f["lost_s"]


def profile(base: dict[str, Any]) -> dict[str, float]:
    """The fault-free run's parts, seconds per node: first startup, step time, stall per checkpoint, teardown."""
    first, last = base["run_ledger_s"][0], base["run_ledger_s"][-1]
    return {
        "startup_s": first["startup"] + first["restore"],
        "step_s": base["step_s"],
        "checkpoint_stall_s": sum(r["checkpoint"] for r in base["run_ledger_s"]) / base["checkpoints"],
        "teardown_s": last["teardown"],
    }


def settled(v: dict[str, Any]) -> list[dict[str, Any]]:
    """The faults whose cost was cut (goodput.py's `cut`): those the training resumed after."""
    return [f for f in v["faults"] if f["held_s"] is not None]


def unscheduled(v: dict[str, Any]) -> list[float]:
    """Restarts that no injected fault caused (the time limit's signal, reached by a slow run): a run that began
    while no fault waited for its resume costs the teardown of the run before and its own startup and restore."""
    runs, parts = v["runs"], v["run_ledger_s"]

    def recovering(t: float) -> bool:
        return any(f["injected_at"] <= t <= (f["first_resumed_step_at"] or math.inf) for f in v["faults"])

    return [
        round(parts[i - 1]["teardown"] + parts[i]["startup"] + parts[i]["restore"], 2)
        for i in range(1, len(runs))
        if not recovering(runs[i]["start"])
    ]


def predict(v: dict[str, Any], base: dict[str, float], checkpoints: int) -> dict[str, Any]:
    """The benchmark's goodput of variant `v` from the fault-free profile, its own faults' costs (a fault it never
    resumed from is named in `unsettled`, its cost unknown) and its restarts that no fault caused."""
    work = v["steps"] * v["step_s"]  # its own steps' pace: the machine's load when it ran, no fault's doing
    faults = {f["fault"]: round(fault_cost(f), 2) for f in settled(v)}
    restarts = unscheduled(v)
    per_node = base["startup_s"] + work + checkpoints * base["checkpoint_stall_s"] + base["teardown_s"]
    allocated = v["allocated_nodes"] * (per_node + sum(faults.values()) + sum(restarts))
    return {
        "variant": v["variant"],
        "fault_cost_s": faults,
        "predicted": round(v["nodes"] * work / allocated, 4),
        "measured": v["goodput"],
        "unsettled": [f["fault"] for f in v["faults"] if f["held_s"] is None],
        "unscheduled_restart_s": restarts,
        "wall_s": v["wall_s"],
    }


def downtime(v: dict[str, Any], kind: str) -> float:
    """A fault kind's downtime on a dedicated cluster: held + queue + startup (the restore is the GPU-size one)."""
    f = next((x for x in settled(v) if x["fault"] == kind), None)
    if f is None:
        raise LookupError(f"{v['variant']}: no settled {kind} in the benchmark's result: nothing to project from")
    return f["held_s"] + f["queue_s"] + f["startup_s"]


def project(
    v: dict[str, Any], stall_s: float, restore_s: float, spares: int, restarted: dict[str, float] | None = None
) -> dict[str, Any]:
    """Llama 3's scale and fault mix, with variant `v`'s measured fault costs (module docstring); `restarted`: the
    kinds an in-job restart takes, with restart.py's time from the fault to the relaunched ranks (for the variant's)."""
    counts = LLAMA3["interruptions"]
    total = sum(counts.values())
    mtbf = LLAMA3["days"] * 86400 / total
    share = {k: sum(n for cause, n in counts.items() if KIND[cause] == k) / total for k in KINDS}
    restarted = restarted or {}
    measured = {k: restarted[k] if k in restarted else downtime(v, k) for k in KINDS}
    down = {k: round(measured[k] + restore_s, 2) for k in KINDS}
    expected = sum(share[k] * down[k] for k in KINDS)
    tau = math.sqrt(2 * stall_s * mtbf)
    nodes = LLAMA3["gpus"] // LLAMA3["gpus_per_node"]
    share_kept = tau / (tau + stall_s) * nodes / (nodes + spares)
    kept = share_kept * (1 - (expected + (tau + stall_s) / 2) / mtbf)
    # the mean downtime at which this stall and these spares would keep the goal
    allowed = mtbf * (1 - GOAL / share_kept) - (tau + stall_s) / 2
    return {
        "variant": v["variant"],
        "in_job_restarts": sorted(restarted),
        "mtbf_s": round(mtbf, 1),
        "checkpoint_stall_s": round(stall_s, 3),
        "interval_s": round(tau, 1),
        "downtime_s": down,
        "expected_downtime_s": round(expected, 1),
        "spare_nodes": spares,
        "goodput": round(kept, 4),
        "downtime_for_goal_s": round(allowed, 1),
        "lost_to": {
            "checkpoint_stall": round(stall_s / (tau + stall_s), 4),
            "downtime": round(expected / mtbf, 4),
            "recomputed_work": round((tau + stall_s) / 2 / mtbf, 4),
            "spare_nodes": round(spares / (nodes + spares), 4),
        },
    }


def model(
    goodput: dict[str, Any],
    ckpt: dict[str, Any],
    restored: dict[str, Any],
    restarts: dict[str, Any],
    scenario: str = "quiet",
) -> dict[str, Any]:
    """`goodput`: goodput.py's result; `ckpt`: checkpoint_cost.py's, sync and async (the stall); `restored`: one of
    checkpoint_cost.py's with a resume of the same model on the same GPU (the restore); `restarts`: restart.py's."""
    found = variants(goodput, scenario)
    base = profile(found["baseline"])
    checkpoints = found["baseline"]["checkpoints"]
    predicted = [predict(v, base, checkpoints) for v in found.values()]
    stall = {mode: ckpt["modes"][mode]["stall_s"]["mean"] for mode in ("sync", "async")}
    restore = restored["resume"]["restore_s"]
    restart_s = {k: restarts["summary"][name]["fault_to_relaunched_ranks_s"]["median"] for k, name in RESTARTED.items()}
    projected = [
        {
            "label": label,
            **project(found[name], stall[save], restore, spares, restart_s if in_job else None),
            "save": save,
        }
        for label, name, save, spares, in_job in PROJECTED
    ]
    counts = LLAMA3["interruptions"]
    return {
        "inputs": {
            "goodput": goodput.get("commit"),
            "scenario": scenario,
            "checkpoint": ckpt["what"],
            "checkpoint_machine": ckpt["machine"]["gpu"] or "CPU",
            "checkpoint_bytes": ckpt["modes"]["async"]["checkpoint_bytes"],
            "restore": restored["what"],
            "restore_s": round(restore, 3),
            "restarts": f"{restarts['command']} ({restarts['date']}, SLURM {restarts['slurm']})",
        },
        "profile": {k: round(x, 4) for k, x in base.items()},
        "benchmark": predicted,
        "llama3": {
            **{k: LLAMA3[k] for k in ("source", "gpus", "days", "effective_training_time")},
            "interruptions": sum(counts.values()),
            "by_kind": {k: sum(n for c, n in counts.items() if KIND[c] == k) for k in KINDS},
        },
        "projected": projected,
        "goal": GOAL,
        "limits": LIMITS,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--goodput", type=Path, default=REPO / "benchmarks" / "results-goodput.json")
    ap.add_argument("--checkpoint", type=Path, default=REPO / "benchmarks" / "results-checkpoint-async-h100.json")
    ap.add_argument("--restore", type=Path, default=REPO / "benchmarks" / "results-checkpoint-verify-h100.json",
                    help="a checkpoint_cost.py result with a resume of the same model (the restore)")  # fmt: skip
    ap.add_argument("--restarts", type=Path, default=REPO / "benchmarks" / "results-restart.json",
                    help="restart.py's result: in-job restarts, the fault to the relaunched ranks")  # fmt: skip
    ap.add_argument("--scenario", default="quiet")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results-goodput-model.json")
    args = ap.parse_args(argv)
    result = model(load(args.goodput), load(args.checkpoint), load(args.restore), load(args.restarts), args.scenario)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result["benchmark"]:
        print(f"{row['variant']:10} predicted {row['predicted']:.3f} measured {row['measured']}")
    for row in result["projected"]:
        print(f"{row['label']:45} projected {row['goodput']:.4f} (interval {row['interval_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
