"""The shape of the code, kept: no import circles in the core, the core never imports the adapter, and every
script under benchmarks/ at least imports (or runs at a tiny size), so a rename cannot break one unseen."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

CORE, ADAPTER = "snakemake_executor_multinode", "snakemake_executor_plugin_multinode"


def imports(path: Path, package: str) -> set[str]:
    """The modules of our two packages that `path` imports, at any depth of the file (function-level too)."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" for a in node.names] + [prefix]
        else:
            continue
        for name in names:
            if name.split(".")[0] in (CORE, ADAPTER):
                found.add(name)
    return found


def module_graph(package: str) -> dict[str, set[str]]:
    files = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (REPO / package).rglob("*.py")
    }
    graph = {}
    for name, path in files.items():
        targets = set()
        for imported in imports(path, package):
            while imported and imported not in files:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and imported != package:
                targets.add(imported)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_core_has_no_import_circle():
    assert cycles(module_graph(CORE)) == []


def test_a_circle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


# The core's stages, lowest first: a module imports its own stage or lower ones, never a higher one. What two stages
# share lives in the contract. docs/design.md draws the same order.
STAGES = ("contract", "slurm", "sandbox", "launching", "planning", "watching", "session", "cli")


def stage(module: str) -> str:
    """snakemake_executor_multinode.<stage>[.<module>] -> <stage>; the root package holds only the version."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "contract"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} ({stage(a)}) imports {b} ({stage(b)})"
        for a, targets in graph.items()
        for b in targets
        if STAGES.index(stage(b)) > STAGES.index(stage(a))
    )


def test_every_module_of_the_core_belongs_to_a_stage():
    assert {stage(m) for m in module_graph(CORE)} <= set(STAGES)


def test_stages_import_downward_only():
    assert upward_imports(module_graph(CORE)) == []


def test_an_upward_import_would_be_found():
    graph = {f"{CORE}.launching.launcher": {f"{CORE}.planning.plan", f"{CORE}.contract.protocol"}}
    assert upward_imports(graph) == [f"{CORE}.launching.launcher (launching) imports {CORE}.planning.plan (planning)"]


def test_the_core_never_imports_the_adapter():
    offenders = {
        str(p.relative_to(REPO)): sorted(n for n in imports(p, CORE) if n.startswith(ADAPTER))
        for p in (REPO / CORE).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def core_modules_imported_by_the_adapter() -> set[str]:
    files = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / CORE).rglob("*.py")
    }
    found = set()
    for path in (REPO / ADAPTER).rglob("*.py"):
        for imported in imports(path, ADAPTER):
            while imported and imported not in files:
                imported = imported.rpartition(".")[0]
            if imported and imported.startswith(f"{CORE}."):
                found.add(imported)
    return found


def test_the_adapter_enters_the_core_through_the_session():
    """session.py is the adapter's one door: besides it the adapter may read the contract, three core modules at most;
    what else it needs, session.py names in its __all__."""
    used = core_modules_imported_by_the_adapter()
    assert f"{CORE}.session" in used and len(used) <= 3, sorted(used)
    assert [m for m in used if m != f"{CORE}.session" and not m.startswith(f"{CORE}.contract.")] == []


BENCHMARK_MODULES = [
    "benchmarks/chain_breakdown.py",
    "benchmarks/chain_overhead.py",
    "benchmarks/checkpoint_cost.py",
    "benchmarks/fanout.py",
    "benchmarks/goodput.py",
    "benchmarks/launch.py",
    "benchmarks/loss_parity.py",
    "benchmarks/gpu/plain_torch.py",
    "benchmarks/snapshot.py",
    "benchmarks/state_scaling.py",
]


@pytest.mark.parametrize("script", BENCHMARK_MODULES)
def test_every_benchmark_script_imports(script):
    spec = importlib.util.spec_from_file_location(Path(script).stem + "_under_test", REPO / script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # its main() runs only as __main__


def test_the_snapshot_benchmark_runs_at_a_tiny_size(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks/snapshot.py"), "--files", "20", "--out", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert results["generated_20_files"]["files"] == 21 and results["example_repository"]["snapshot_dirs"] == 2


def test_the_state_scaling_benchmark_runs_at_a_tiny_size(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks/state_scaling.py"), "--jobs", "20", "--histories", "0,2", "--running",
         "20", "--cycles", "5", "--out", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert [row["records"] for row in results["reattach"]] == [0, 40]
    cycles = results["status_cycle_file_syscalls"]
    if cycles != "strace not installed":
        assert [row["running_jobs"] for row in cycles] == [10, 20]
        assert cycles[0]["listing"] == cycles[1]["listing"]  # flat: one listing, whatever runs


def test_the_gpu_summary_is_the_steady_tokens_over_their_wall_clock_after_the_first_interval(tmp_path):
    metrics = tmp_path / "m.jsonl"
    # 10 steps of 100 tokens a line; the first interval (the compile) took 50 s, then 1 s, 2 s and 1 s + a 1 s save.
    rows = [
        {"step": 10, "tokens": 1000, "tokens_per_s": 20.0, "mfu": 0.2, "time": 50.0, "loss": 3.0},
        {"step": 20, "tokens": 2000, "tokens_per_s": 1000.0, "mfu": 10.0, "time": 51.0, "ckpt_s": 0.0, "loss": 2.5},
        {"step": 30, "tokens": 3000, "tokens_per_s": 500.0, "mfu": 5.0, "time": 53.0, "ckpt_s": 0.0, "loss": 2.2},
        {"step": 40, "tokens": 4000, "tokens_per_s": 1000.0, "mfu": 10.0, "time": 55.0, "ckpt_s": 1.0, "loss": 2.0},
    ]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/gpu/summarize.py"), "v", str(metrics)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    summary = json.loads(out.stdout)
    assert summary["tokens_per_s"] == 750 and summary["span_tokens_per_s"] == 750  # 3000 tokens in 4 s
    assert summary["step_ms"] == 133.3 and summary["mfu"] == 7.5 and summary["first_interval_s"] == 50.0


@pytest.mark.parametrize(
    "script", ["benchmarks/launch_worker.py", "benchmarks/launch_probe/sitecustomize.py", "benchmarks/gpu/run.sh"]
)
def test_scripts_that_run_only_inside_a_benchmark_job_compile(script):
    path = REPO / script
    if path.suffix == ".sh":
        subprocess.run(["bash", "-n", str(path)], check=True)
    else:
        compile(path.read_text(), str(path), "exec")


SITE_STUB = "benchmarks/gpu/site_stub"
SITE_STUB_FILES = ["bitsandbytes/__init__.py", "bitsandbytes/optim/__init__.py", "bitsandbytes/optim/optimizer.py"]


def test_the_bitsandbytes_stand_in_gives_the_base_class_galore_needs_and_refuses_to_be_used():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from bitsandbytes.optim.optimizer import Optimizer2State\n"
        "class GaLore8bit(Optimizer2State): pass\n"  # what galore_torch and ColossalAI do at import time
        "try:\n    GaLore8bit([])\nexcept RuntimeError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO / SITE_STUB)], capture_output=True, text=True, check=True
    ).stdout
    assert "not installed here" in out


def test_every_benchmark_script_is_covered_here():
    covered = {*BENCHMARK_MODULES, "benchmarks/gpu/summarize.py", "benchmarks/launch_worker.py"}
    covered |= {"benchmarks/render.py"}  # tests/unit/test_benchmark_tables.py runs it on the committed results
    covered |= {"benchmarks/launch_probe/sitecustomize.py", "benchmarks/gpu/run.sh"}
    covered |= {f"{SITE_STUB}/{f}" for f in SITE_STUB_FILES}
    scripts = {str(p.relative_to(REPO)) for p in (REPO / "benchmarks").rglob("*") if p.suffix in (".py", ".sh")}
    assert scripts == covered


def test_no_test_module_imports_another():
    """Shared test code lives in tests/helpers.py (and tests/training/helpers.py for the training tests) only."""
    offenders = []
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if re.search(r"(^|\.)test_\w+$", n)]
    assert offenders == []


@pytest.mark.parametrize("script", sorted(str(p.relative_to(REPO)) for p in (REPO / "scripts").glob("*.sh")))
def test_every_script_parses(script):
    """scripts/test.sh is CI itself and scripts/example.sh the README's first command: both at least parse."""
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)
