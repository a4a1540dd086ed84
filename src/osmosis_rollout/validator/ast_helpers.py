"""Generic helpers over Python's ``ast`` for the static checks: scoped walks, imports, signatures,
and whether a block always ends in ``return`` or ``raise``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _walk(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``body``, without entering nested functions, lambdas or classes."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _FUNCS):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _import_map(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted origin for every import in the file (``sleep`` -> ``time.sleep``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _binds(tree: ast.Module, name: str) -> bool:
    """Whether the file binds ``name`` some way other than a top-level class (import,
    assignment, star import, module ``__getattr__``); then only the import can tell."""
    for node in ast.walk(tree):
        if isinstance(node, ast.alias):
            if node.name == "*" or (node.asname or node.name.split(".")[0]) == name:
                return True
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name in (name, "__getattr__"):
                return True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
    return False


def _methods(chain: list[ast.ClassDef]) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for klass in chain:
        for stmt in klass.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault(stmt.name, stmt)
            elif (value := _assigned_any(stmt)) is not None:
                for name in value:
                    found.setdefault(name, stmt)
    return found


def _assigned(stmt: ast.stmt, name: str) -> ast.expr | None:
    if isinstance(stmt, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in stmt.targets
    ):
        return stmt.value
    if (
        isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and stmt.target.id == name
    ):
        return stmt.value
    return None


def _assigned_any(stmt: ast.stmt) -> list[str] | None:
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    return None


def _param(fn: ast.FunctionDef | ast.AsyncFunctionDef, index: int) -> str | None:
    params = [*fn.args.posonlyargs, *fn.args.args]
    return params[index].arg if len(params) > index else None


def _takes(fn: ast.FunctionDef | ast.AsyncFunctionDef, count: int) -> bool:
    """Whether ``fn`` can be called with exactly ``count`` positional arguments."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    kw_required = any(d is None for d in args.kw_defaults)
    enough = len(positional) >= count or args.vararg is not None
    return enough and required <= count and not kw_required


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    if isinstance(node, ast.Subscript):  # Generic[T], Base[...]
        return _dotted(node.value)
    return None


def _qualify(func: ast.expr, imports: dict[str, str]) -> str | None:
    dotted = _dotted(func)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    origin = imports.get(head, head)
    return f"{origin}.{rest}" if rest else origin


def _root_name(node: ast.expr) -> str | None:
    """``messages`` for ``messages[0]``, ``messages[-1]["content"]`` (subscripts only)."""
    if not isinstance(node, ast.Subscript):
        return node.id if isinstance(node, ast.Name) else None
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _terminates(body: list[ast.stmt]) -> bool:
    """Whether every path through ``body`` ends in ``return`` or ``raise``."""
    return any(_stmt_terminates(stmt) for stmt in body)


def _stmt_terminates(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Return | ast.Raise):
        return True
    if isinstance(stmt, ast.If):
        return _terminates(stmt.body) and _terminates(stmt.orelse)
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return _terminates(stmt.body)
    if isinstance(stmt, ast.While):
        infinite = isinstance(stmt.test, ast.Constant) and bool(stmt.test.value)
        breaks = any(isinstance(n, ast.Break) for n in _walk_loop(stmt.body))
        return (infinite and not breaks) or (not breaks and _terminates(stmt.orelse))
    if isinstance(stmt, ast.For | ast.AsyncFor):
        breaks = any(isinstance(n, ast.Break) for n in _walk_loop(stmt.body))
        return not breaks and _terminates(stmt.orelse)
    if isinstance(stmt, ast.Try | ast.TryStar):
        if _terminates(stmt.finalbody):
            return True
        main = _terminates(stmt.body) or _terminates(stmt.orelse)
        return main and all(_terminates(h.body) for h in stmt.handlers)
    if isinstance(stmt, ast.Match):
        last = stmt.cases[-1] if stmt.cases else None
        exhaustive = (
            last is not None
            and isinstance(last.pattern, ast.MatchAs)
            and last.pattern.pattern is None
            and last.guard is None
        )
        return exhaustive and all(_terminates(c.body) for c in stmt.cases)
    return False


def _walk_loop(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Nodes of a loop body that a ``break`` there would belong to (not nested loops)."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (*_FUNCS, ast.For, ast.AsyncFor, ast.While)):
                stack.append(child)
