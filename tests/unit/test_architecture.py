"""The shape of the code, kept: no import circles in the core, the core never imports the adapter, no function of
the two packages over 60 lines, and every script under benchmarks/ at least imports (or runs at a tiny size), so a
rename cannot break one unseen.
The tests that start processes: tests/process/test_architecture.py."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO, SITE_STUB

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
STAGES = (
    "util",
    "contract",
    "training",
    "slurm",
    "sandbox",
    "launching",
    "planning",
    "watching",
    "submitting",
    "session",
    "cli",
)


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


# A function longer than this does more than one thing: split it into pieces named for what each does.
MAX_FUNCTION_LINES = 60


def long_functions(path: Path, source: str) -> list[str]:
    """Every function and method of `source` over MAX_FUNCTION_LINES lines, as `path:line name (N lines)`. A
    function's lines run from its `def` to its last line, docstring and comments included, decorators not."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_every_function_of_the_two_packages_is_60_lines_at_most():
    offenders = [
        found
        for package in (CORE, ADAPTER)
        for path in sorted((REPO / package).rglob("*.py"))
        for found in long_functions(path.relative_to(REPO), path.read_text())
    ]
    assert offenders == [], f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def test_a_long_function_or_method_would_be_found():
    def function(name: str, lines: int, indent: str = "") -> str:
        return f"{indent}def {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))

    source = function("fits", MAX_FUNCTION_LINES) + "class C:\n    @property\n" + function("long", 61, "    ")
    line = MAX_FUNCTION_LINES + 3  # after `fits`, the class line and the decorator, which is not counted
    assert long_functions(Path("m.py"), source) == [f"m.py:{line} long (61 lines)"]


BENCHMARK_MODULES = [
    "benchmarks/chain_breakdown.py",
    "benchmarks/chain_overhead.py",
    "benchmarks/checkpoint_cost.py",
    "benchmarks/fanout.py",
    "benchmarks/goodput.py",
    "benchmarks/goodput_model.py",
    "benchmarks/launch.py",
    "benchmarks/loss_parity.py",
    "benchmarks/gpu/plain_torch.py",
    "benchmarks/restart.py",
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


SITE_STUB_FILES = ["bitsandbytes/__init__.py", "bitsandbytes/optim/__init__.py", "bitsandbytes/optim/optimizer.py"]


def test_every_benchmark_script_is_covered_here():
    """Here or, where the test runs the script, in tests/process/test_architecture.py."""
    covered = {*BENCHMARK_MODULES, "benchmarks/gpu/summarize.py", "benchmarks/launch_worker.py"}
    covered |= {"benchmarks/render.py"}  # tests/unit/test_benchmark_tables.py runs it on the committed results
    covered |= {"benchmarks/launch_probe/sitecustomize.py", "benchmarks/gpu/run.sh"}
    covered |= {f"{SITE_STUB}/{f}" for f in SITE_STUB_FILES}
    # tests/process/test_gpu_scripts.py: the first job on the lent GPU, what of it runs without one
    covered |= {f"benchmarks/gpu/{f}" for f in ("slurm_on_device.sh", "carry_first_job.sh", "first_job_checks.py")}
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


def test_the_plugin_imports_only_its_own_dependencies_never_the_example_training_s():
    """pyproject.toml's dependencies are the plugin's, its train extra the example training's: no module of the two
    packages imports a package of that extra. Snakemake is the user's; torch is the training's, imported only by the
    network preflight and the trackers' helper, which run in the training's processes on the nodes."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    allowed = {re.split(r"[<>=!~ \[;]", d)[0].replace("-", "_").lower() for d in project["dependencies"]}
    allowed |= {"yaml", "snakemake", "torch"}  # pyyaml's import name; the user's Snakemake; the training's torch
    found: dict[str, set[str]] = {}
    for package in (CORE, ADAPTER):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names):
                    if not top.startswith("snakemake_executor") and top.lower() not in allowed:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    assert found == {}
    train = {re.split(r"[<>=!~ \[;]", d)[0] for d in project["optional-dependencies"]["train"]}
    assert "py-spy" not in train and "py-spy" in {re.split(r"[<>=!~ \[;]", d)[0] for d in project["dependencies"]}


def design_map() -> dict[str, str]:
    """docs/design.md's map (its first code block), cut by folder: each stage folder's text, the adapter's, and the
    whole map under "" (modules at the core's top, as session.py)."""
    text = (REPO / "docs" / "design.md").read_text()
    block = text.split("```", 2)[1]
    sections: dict[str, str] = {"": block}
    current = ""
    for line in block.splitlines():
        found = re.match(r"^\s*(?:Snakemake ─► )?([a-z_]+)/\s", line)
        if found:
            current = found.group(1)
        sections[current] = sections.get(current, "") + line + "\n"
    return sections


def test_the_design_maps_names_every_module_in_its_folder():
    sections = design_map()
    missing = []
    for package in (CORE, ADAPTER):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "__init__.py" or "templates" in path.parts:
                continue
            rel = path.relative_to(REPO / package)
            folder = ADAPTER if package == ADAPTER else (rel.parts[0] if len(rel.parts) > 1 else "")
            if not re.search(rf"(?<![\w/]){re.escape(path.name)}", sections.get(folder, "")):
                missing.append(f"{package}/{rel}")
    assert not missing, f"docs/design.md's map does not name: {', '.join(missing)}"


def test_a_module_the_map_leaves_out_would_be_found():
    sections = design_map()
    assert "settings.py" in sections["planning"] and "job_status.py" not in sections["planning"]
    assert "notify.py" in sections["watching"] and "notify.py" not in sections["launching"]
