"""The import graph of ``src/osmosis_rollout``: no circles, and the arrows docs/architecture.md
promises.

The graph is built from the AST of every module, so it sees every import statement: at module
level, under ``if TYPE_CHECKING:`` and inside functions. All three count. A ``TYPE_CHECKING``
import that closes a circle is a name in the wrong module; so is a lazy import that does (a
lazy import is for start-up speed, never to get round a circle). ``from pkg import name`` is an
arrow to ``pkg.name`` when that is a module, else to ``pkg``; the ``__init__`` of a parent
package that Python also runs is not an arrow, since a package re-exporting its modules would
otherwise make a circle with each of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

import osmosis_rollout

PACKAGE = "osmosis_rollout"
ROOT = Path(osmosis_rollout.__file__).parent

#: The modules that import nothing of ours but each other (docs/architecture.md, first rule).
LEAVES = frozenset(
    f"{PACKAGE}.{name}"
    for name in (
        "protocol",
        "sampling",
        "server_url",
        "destinations",
        "redaction",
        "findings",
        "errors",
    )
)


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module under the package: dotted name -> (file, whether it is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement reaches."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, *([node.module] if node.module else [])])
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (anywhere in its file)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        arrows: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = _targets(node, module, is_package)
            if isinstance(node, ast.ImportFrom):
                # ``from pkg import name``: the submodule when there is one, else the package.
                submodules = [name for name in names[:-1] if name in modules]
                names = (
                    submodules if len(submodules) == len(names) - 1 else [*submodules, names[-1]]
                )
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    arrows.add(name)
        graph[module] = arrows
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


def one_cycle(graph: dict[str, set[str]], members: frozenset[str]) -> list[str]:
    """A concrete cycle through a strongly connected set, to name in a failure."""
    start = min(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                return [*paths[node], start]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    return sorted(members)  # unreachable for a strongly connected set


GRAPH = import_graph()


def test_the_graph_sees_every_kind_of_import() -> None:
    """The graph is what the rules are checked on: it holds a module-level arrow, one under
    ``TYPE_CHECKING`` and one inside a function (if it missed one, a circle could hide)."""
    assert f"{PACKAGE}.server.types" in GRAPH[f"{PACKAGE}.server.registry"]  # module level
    assert f"{PACKAGE}.protocol" in GRAPH[f"{PACKAGE}.server.types"]  # TYPE_CHECKING
    assert f"{PACKAGE}.server.wire.v2" in GRAPH[f"{PACKAGE}.server.wire"]  # in a function


def test_the_circle_finder_finds_a_circle() -> None:
    """A three-module loop is found and named in order; a chain is not a circle."""
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(loop) == [frozenset("abc")]
    assert one_cycle(loop, frozenset("abc")) == ["a", "b", "c", "a"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_there_are_no_import_circles() -> None:
    """No module reaches itself through its imports (TYPE_CHECKING and lazy ones included)."""
    new = circles(GRAPH)
    named = ["  " + " -> ".join(one_cycle(GRAPH, found)) for found in new]
    assert not new, "import circles (put each name where it belongs):\n" + "\n".join(named)


@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_the_leaf_modules_import_only_each_other(leaf: str) -> None:
    """``protocol``, ``sampling``, ``server_url``, ``destinations``, ``redaction`` and
    ``errors`` import nothing of ours but each other."""
    assert GRAPH[leaf] <= LEAVES, f"{leaf} imports {sorted(GRAPH[leaf] - LEAVES)}"


def test_nothing_imports_cli() -> None:
    """Only ``cli`` itself, and ``python -m osmosis_rollout`` (``__main__``, the same entry
    point as the ``osmosis`` command), import ``cli``."""
    cli = f"{PACKAGE}.cli"
    importers = sorted(
        module
        for module, arrows in GRAPH.items()
        if not (module == cli or module.startswith(cli + "."))
        and module != f"{PACKAGE}.__main__"
        and any(target == cli or target.startswith(cli + ".") for target in arrows)
    )
    assert importers == []


def test_the_wire_seams_types_import_nothing_of_the_server() -> None:
    """``server/types.py`` is the leaf both the core and the wires import."""
    server = f"{PACKAGE}.server"
    inside = sorted(
        t for t in GRAPH[f"{server}.types"] if t == server or t.startswith(server + ".")
    )
    assert inside == []
