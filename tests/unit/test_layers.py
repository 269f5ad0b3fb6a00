"""The package shows the architecture: core's layers point one way, and core needs nothing outside it.

Read from the source (every ``import``/``from`` statement, at module level or inside functions and
``TYPE_CHECKING`` blocks), so a lazy import cannot hide a dependency that points the wrong way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import streamlet

PACKAGE = Path(streamlet.__file__).parent
CORE_LAYERS = ("model", "windows", "state", "runtime")  # each may import only those before it
OUTSIDE_CORE = ("transport", "backends", "adaptation", "connectors", "cli", "testing", "loading", "run_report")


def imported_modules(path: Path) -> set[str]:
    """Every streamlet module ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("streamlet"):
            found.add(node.module)
            found.update(
                f"{node.module}.{alias.name}" for alias in node.names
            )  # "from streamlet.core.model import graph"
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("streamlet"))
    return found


def core_modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts): path
        for path in sorted((PACKAGE / "core").rglob("*.py"))
    }


def test_core_imports_nothing_from_transport_backends_adaptation_or_connectors() -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, path in core_modules().items()
        for target in imported_modules(path)
        if target.split(".")[1] in OUTSIDE_CORE
    )
    assert wrong == []


def test_core_layers_point_one_way() -> None:
    """model <- windows <- state <- runtime: a layer imports only the layers before it."""
    wrong = []
    for module, path in core_modules().items():
        parts = module.split(".")
        if len(parts) < 4:  # streamlet.core.__init__ and the layers' own __init__ have no code
            continue
        layer = CORE_LAYERS.index(parts[2])
        for target in imported_modules(path):
            target_parts = target.split(".")
            inside_core = target_parts[:2] == ["streamlet", "core"] and len(target_parts) > 2
            if inside_core and CORE_LAYERS.index(target_parts[2]) > layer:
                wrong.append(f"{module} -> {target}")
    assert sorted(wrong) == []


def test_validation_does_not_import_the_topology() -> None:
    """topology.py imports validation; validation reads a topology through a protocol, so there is no cycle."""
    validation = PACKAGE / "core" / "model" / "validation.py"
    assert not any("topology" in target for target in imported_modules(validation))


def test_every_core_module_sits_in_a_layer() -> None:
    loose = sorted(m for m in core_modules() if len(m.split(".")) == 3 and not m.endswith("__init__"))
    assert loose == []


def test_every_seam_is_in_streamlet_abc_and_is_the_class_the_code_uses() -> None:
    """streamlet.abc re-exports each seam: the very object its layer defines, not a copy."""
    import streamlet.abc as seams
    from streamlet.backends.cluster.tree.store import ClusterStore
    from streamlet.core.model.clock import Clock
    from streamlet.core.runtime.channel import Channel
    from streamlet.core.state.store import CheckpointStore

    expected = {"Channel", "Clock", "Source", "Sink", "StateStore", "CheckpointStore", "ClusterStore", "Task"}
    assert expected <= set(seams.__all__)
    assert (seams.Channel, seams.Clock, seams.CheckpointStore, seams.ClusterStore) == (
        Channel, Clock, CheckpointStore, ClusterStore,
    )  # fmt: skip
    assert (seams.Source, seams.Sink, seams.Task) == (streamlet.Source, streamlet.Sink, streamlet.Task)


# -- the cluster by role: leader, worker and client meet only in the coordination tree ----------------------------

CLUSTER = PACKAGE / "backends" / "cluster"
ROLES = ("leader", "worker", "client")  # talk to each other only through the tree's nodes
STARTERS = ("local", "simulated")  # start the roles, so they may import them
OTHER_BACKENDS_ALLOWED = ("streamlet.backends.cluster.tree",)  # what local.py, processes/, monitor/ may use


def modules_under(folder: Path) -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts): path for path in sorted(folder.rglob("*.py"))
    }


def backend_imports(path: Path) -> set[str]:
    """The modules of ``streamlet.backends`` that ``path`` imports (packages and modules alike)."""
    return {target for target in imported_modules(path) if target.startswith("streamlet.backends.")}


def cluster_folder(target: str) -> str | None:
    """``leader`` for ``streamlet.backends.cluster.leader.leader``; ``None`` outside the cluster backend."""
    parts = target.split(".")
    return parts[3] if parts[:3] == ["streamlet", "backends", "cluster"] and len(parts) > 3 else None


def test_every_cluster_module_sits_in_a_role_folder() -> None:
    loose = sorted(p.name for p in CLUSTER.glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in CLUSTER.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert (loose, folders) == ([], sorted(("tree", *ROLES, *STARTERS)))


def test_the_roles_import_only_the_tree_and_never_each_other() -> None:
    """leader/, worker/ and client/ use the tree (and core, transport, adaptation, shared modules), no other
    role and no other backend: what one role tells another goes through a node of the tree."""
    wrong = sorted(
        f"{module} -> {target}"
        for role in ROLES
        for module, path in modules_under(CLUSTER / role).items()
        for target in backend_imports(path)
        if cluster_folder(target) not in ("tree", role)
    )
    assert wrong == []


def test_the_tree_imports_no_role() -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, path in modules_under(CLUSTER / "tree").items()
        for target in backend_imports(path)
        if cluster_folder(target) != "tree"
    )
    assert wrong == []


def test_the_other_backends_use_at_most_the_clusters_tree() -> None:
    """The in-process backends, the process pool and the monitor read the tree, never a role's code."""
    others = {
        module: path
        for module, path in modules_under(PACKAGE / "backends").items()
        if cluster_folder(module) is None and module != "streamlet.backends.cluster"
    }
    wrong = sorted(
        f"{module} -> {target}"
        for module, path in others.items()
        for target in backend_imports(path)
        if target.startswith("streamlet.backends.cluster") and not target.startswith(OTHER_BACKENDS_ALLOWED)
    )
    assert wrong == []


def test_the_layout_rules_catch_a_role_reaching_into_another(tmp_path: Path) -> None:
    """The checks read real import statements: a worker module importing the leader is seen."""
    reach = tmp_path / "reach.py"
    reach.write_text("def f():\n    from streamlet.backends.cluster.leader.leader import Leader\n")
    assert {cluster_folder(t) for t in backend_imports(reach)} == {"leader"}


def private_reaches(path: Path) -> list[str]:
    """``x._name`` where ``x`` is not ``self``/``cls``, and any write to ``__class__``, at their lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Attribute):
            continue
        own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        private = node.attr.startswith("_") and not node.attr.endswith("__")
        if (private and not own) or (node.attr == "__class__" and isinstance(node.ctx, ast.Store)):
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return sorted(found)


def test_the_simulated_cluster_touches_no_private_attribute_of_another_object() -> None:
    """The harness drives the roles through their public seams (``WorkerJobs.poll``, ``on_part_built``, an
    injected load sample, ``Job.built``, the counters' observer), so what it tests is what runs."""
    reaches = [reach for path in sorted((CLUSTER / "simulated").glob("*.py")) for reach in private_reaches(path)]
    assert reaches == []


def test_the_private_reach_check_sees_a_reach_and_a_class_swap(tmp_path: Path) -> None:
    source = tmp_path / "harness.py"
    source.write_text("def f(parts, counters):\n    parts._poll()\n    counters.__class__ = int\n    self._own = 1\n")
    assert private_reaches(source) == ["harness.py:2 ._poll", "harness.py:3 .__class__"]


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other, directly or round a circle (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_two_modules_import_each_other() -> None:
    """Not even lazily or for type checking: a circle means two modules that are one (or a seam not cut)."""
    paths = {name.removesuffix(".__init__"): path for name, path in modules_under(PACKAGE).items()}
    graph = {name: {t for t in imported_modules(path) if t in paths and t != name} for name, path in paths.items()}
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_circle_of_three() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
