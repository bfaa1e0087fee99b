"""Imports between inferd's packages go one way (docs/architecture.md draws it). Every module under
inferd/ is parsed with `ast`; a module belongs to its top-level package (`inferd/engine/...` →
engine) or is a node of its own (`inferd/errors.py` → errors). Every import of another node must
be an edge listed below, and the listed edges must form no cycle. Inside the packages, no module
may reach itself through its imports either (`module_cycles`): a circle hides which module is the
lower layer, and Python imports it in an order that depends on who came first. Imports inside
functions and under TYPE_CHECKING count: they are dependencies all the same."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The bottom row: plain data, errors, facts about the machine. Among themselves they import only
# what is listed; every node above may import any of them.
BASE: dict[str, set[str]] = {
    "version": set(),
    "errors": set(),
    "cache": set(),
    "cpu_info": set(),
    "c_compiler": set(),
    "fp8": set(),
    "kv_int8": set(),
    "progress": set(),
    "config": set(),
    "outputs": set(),
    "step_timing": set(),
    "step_efficiency": {"step_timing"},  # MBU / MFU records: histograms of step_timing's kind
    "kv_tier_stats": set(),
    "engine_snapshot": set(),
    "block_hashes": set(),
    "memory_trim": set(),
    "sizes": set(),
    "lora_request": {"errors"},  # which adapter a request runs under (plain data)
    "platform": {"cpu_info"},
    "structured_params": {"errors"},
    "sampling_params": {"errors", "structured_params"},
    "pooling_params": {"errors"},
    "engine_client": {
        "outputs",
        "sampling_params",
        "pooling_params",
        "errors",
        "step_timing",
        "step_efficiency",
        "kv_tier_stats",
        "engine_snapshot",
    },
}
# node → what it may import besides the bottom row (docs/architecture.md has the same table).
ABOVE: dict[str, set[str]] = {
    "cpu_kernels": set(),
    "distributed": set(),
    "attention": {"cpu_kernels"},
    "layers": {"attention", "distributed", "cpu_kernels"},
    "models": {"layers", "attention", "distributed", "cpu_kernels"},
    "loader": {"models", "layers", "distributed"},
    "memory": {"loader", "models"},  # parameter counts from the families' Architecture records
    # capacity planning: memory figures, this machine's peaks by inferd's own kernels
    "plan": {"memory", "loader", "models", "layers", "cpu_kernels"},
    "tokenizer": {"loader"},
    "profiling": {"layers", "cpu_kernels"},  # step timer, traces: instruments a model
    "spec_decode": set(),
    "multimodal": set(),  # images in: decoding, preprocessing, the record sent to the core
    "engine": {"memory", "tokenizer", "loader", "models", "layers", "attention", "distributed",
               "cpu_kernels", "profiling", "spec_decode", "structured", "plan", "multimodal"},
    "structured": {"tokenizer", "loader"},
    "tools": {"structured", "tokenizer"},
    "llm": {"engine", "tokenizer", "loader", "tools", "multimodal"},
    # The engine only as an EngineClient (inferd/engine_client.py); request fields → grammar
    # specs and tool-call parsing are libraries it uses, not the engine.
    "server": {"structured", "tools", "multimodal"},
    "bench": {"llm", "plan"},
    # Ray Serve: the server's app over a RayEngineClient, engine clients in replicas. The
    # engines themselves come from factories that `commands` passes in.
    "ray_serve": {"server"},
    "inferd": {"llm"},  # the package root re-exports the offline API lazily (`_EXPORTS`)
    "commands": {"bench", "server", "llm", "engine", "memory", "loader", "tokenizer",
                 "distributed", "cpu_kernels", "profiling", "spec_decode", "tools", "ray_serve",
                 "plan"},
    "cli": {"commands"},
    "__main__": {"cli"},
}  # fmt: skip
ALLOWED: dict[str, set[str]] = {**BASE, **{n: deps | BASE.keys() for n, deps in ABOVE.items()}}

# Edges that still run against the direction above, each with the work that removes it. The test
# fails once an edge is gone, so that its entry goes with it.
PENDING: dict[tuple[str, str], str] = {}


def node_of(module: str) -> str:
    """'inferd.engine.core.core' → 'engine'; 'inferd.errors' → 'errors'; 'inferd' → 'inferd'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "inferd"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str, modules: frozenset[str] = frozenset()) -> set[str]:
    """Every inferd module `path` imports, wherever the import statement is. `from pkg import sub`
    names the module `pkg.sub` when `sub` is one of `modules`, else `pkg` itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = {f"{source}.{a.name}" for a in node.names} & modules
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(source)
        elif isinstance(node, ast.Assign) and path.name == "__init__.py":
            # lazy re-exports: _EXPORTS = {"LLM": "inferd.llm", ...}
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if names == ["_EXPORTS"] and isinstance(node.value, ast.Dict):
                found |= {v.value for v in node.value.values if isinstance(v, ast.Constant)}
    return {m for m in found if m == "inferd" or m.startswith("inferd.")}


def module_sources(root: Path) -> dict[str, Path]:
    """'inferd.engine.scheduling.scheduler' → its file, for every module under inferd/."""
    return {_module_name(path, root): path for path in sorted((root / "inferd").rglob("*.py"))}


def package_edges(root: Path) -> dict[tuple[str, str], list[str]]:
    """(importing node, imported node) → the files that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    source = root / "inferd"
    for path in sorted(source.rglob("*.py")):
        module = _module_name(path, root)
        here = node_of(module)
        for target in imports_of(path, module):
            there = node_of(target)
            if there != here:
                edges.setdefault((here, there), []).append(str(path.relative_to(root)))
    return edges


def violations(edges: dict[tuple[str, str], list[str]], allowed: dict[str, set[str]]) -> list[str]:
    problems = []
    for (here, there), files in sorted(edges.items()):
        if here not in allowed:
            problems.append(f"{here} is not in ALLOWED: add it at its place in the layering")
        elif there not in allowed[here] and (here, there) not in PENDING:
            problems.append(f"{here} -> {there} goes against the direction ({', '.join(files)})")
    return problems


def test_every_import_follows_the_allowed_direction():
    problems = violations(package_edges(ROOT), ALLOWED)
    assert not problems, "\n".join(problems)


def layering(allowed: dict[str, set[str]]) -> list[str]:
    """The nodes, each after everything it may import; raises CycleError if there is no order."""
    unknown = {t for targets in allowed.values() for t in targets} - allowed.keys()
    assert not unknown, f"edges to nodes missing from ALLOWED: {sorted(unknown)}"
    return list(graphlib.TopologicalSorter(allowed).static_order())


def test_the_allowed_edges_form_no_cycle():
    order = layering(ALLOWED)
    assert order.index("errors") < order.index("engine") < order.index("llm")


def test_pending_exceptions_still_exist():
    edges = package_edges(ROOT)
    gone = [f"{a} -> {b}" for a, b in PENDING if (a, b) not in edges]
    assert not gone, f"no longer imported, remove from PENDING: {gone}"


# ---- no circles between modules -----------------------------------------------------------------
def module_graph(root: Path) -> dict[str, set[str]]:
    """Module → the inferd modules it imports (itself left out)."""
    sources = module_sources(root)
    names = frozenset(sources)
    return {
        module: {m for m in imports_of(path, module, names) if m in names and m != module}
        for module, path in sources.items()
    }


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules (every module in it
    reaches every other through imports), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(start: str) -> None:  # Tarjan, iterative: the graph has ~1,000 modules
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = [stack.pop()]
                    while component[-1] != module:
                        component.append(stack.pop())
                    components.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in stack:
                low[module] = min(low[module], index[target])

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(c for c in components if len(c) > 1)


def circle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest import path from the component's first module back to itself: the imports
    one of which must go."""
    first, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module] & inside):
                if target == first:
                    path = [module]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), first]
                if target not in came_from:
                    came_from[target] = module
                    following.append(target)
        frontier = following
    raise AssertionError(f"{component} is not a circle")


def described_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each circle as its modules, then one path through them (an import of it must go)."""
    return [
        f"{', '.join(c)}: {' -> '.join(circle_through(c, graph))}" for c in module_cycles(graph)
    ]


def test_no_module_imports_itself_through_a_circle():
    problems = described_cycles(module_graph(ROOT))
    assert not problems, "import circles (move what both need into a module of its own):\n" + (
        "\n".join(problems)
    )


# ---- the check itself can fail ------------------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "inferd" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_reversed_import_is_reported(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "engine/__init__.py": "from inferd.loader import open_checkpoint\n",
        "loader/__init__.py": "def f():\n    from inferd.engine.scheduler import Scheduler\n",
        "server/app.py": "from .errors import APIError\nfrom ..engine import engine\n",
        "server/errors.py": "",
    })  # fmt: skip
    edges = package_edges(root)
    assert set(edges) == {("engine", "loader"), ("loader", "engine"), ("server", "engine")}
    problems = violations(edges, ALLOWED)
    assert len(problems) == 2 and "loader -> engine" in problems[0]
    assert "server -> engine" in problems[1] and "inferd/server/app.py" in problems[1]


def test_an_unknown_node_and_a_cycle_are_reported(tmp_path):
    root = _tree(tmp_path, {"newthing.py": "import inferd.errors\n"})
    assert violations(package_edges(root), ALLOWED) == [
        "newthing is not in ALLOWED: add it at its place in the layering"
    ]
    with pytest.raises(graphlib.CycleError):
        layering({**ALLOWED, "loader": ALLOWED["loader"] | {"engine"}})


def test_a_circle_inside_a_package_is_reported_with_its_modules(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/sampler.py": "from inferd.engine.filters import keep\n",
        "engine/filters.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from inferd.engine import penalties\n",
        "engine/penalties.py": "def f():\n    from .sampler import Row\n",
        "engine/scheduler.py": "from inferd.engine import sampler\n",
    })  # fmt: skip
    graph = module_graph(root)
    circle = ["inferd.engine.filters", "inferd.engine.penalties", "inferd.engine.sampler"]
    assert module_cycles(graph) == [circle]
    assert described_cycles(graph) == [f"{', '.join(circle)}: {' -> '.join([*circle, circle[0]])}"]


def test_importing_a_package_is_not_importing_its_modules(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "loader/__init__.py": "from inferd.loader.catalog import resolve\n",
        "loader/catalog.py": "from inferd.loader import gguf_file\n",
        "loader/gguf_file.py": "from inferd.errors import ModelLoadError\n",
        "errors.py": "",
    })  # fmt: skip
    graph = module_graph(root)
    assert graph["inferd.loader.catalog"] == {"inferd.loader.gguf_file"}
    assert module_cycles(graph) == []
