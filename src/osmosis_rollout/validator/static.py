"""Static checks: read the agent's source with ``ast``; nothing is imported or run.

They catch what an import cannot show (a blocking call on a path the dry run never takes, a
history edit on turn 7) and point at ``file.py:LINE``. When the file does not say enough (a base
class imported from elsewhere, a class built by a factory), a check stays silent and leaves the
question to the dynamic checks rather than guess.
"""

from __future__ import annotations

import ast
import builtins
import difflib
from dataclasses import dataclass, field
from pathlib import Path

from ..loader import display_path
from .ast_helpers import (
    _assigned,
    _binds,
    _dotted,
    _import_map,
    _methods,
    _param,
    _qualify,
    _root_name,
    _takes,
    _terminates,
    _walk,
)
from .result import Problem, Severity

__all__ = ["StaticReport", "blocking_calls", "check_source"]

_BASE = "RolloutAgentLoop"
_SUBPROCESS = {"run", "call", "check_call", "check_output", "Popen"}
_EDITS = {"pop", "remove", "insert", "clear", "sort", "reverse"}


@dataclass
class StaticReport:
    """Problems found in the source, plus where the class and its ``run`` are defined."""

    problems: list[Problem] = field(default_factory=list)
    class_location: str | None = None
    run_location: str | None = None


def check_source(path: Path, class_name: str) -> StaticReport:
    """Run every static check on ``class_name`` in the file at ``path``."""
    return _Checker(path, class_name).run()


class _Checker:
    def __init__(self, path: Path, class_name: str) -> None:
        self.path = path
        self.shown = display_path(path)
        self.class_name = class_name
        self.report = StaticReport()

    # -- helpers ---------------------------------------------------------------------------------

    def at(self, node: ast.AST | int) -> str:
        line = node if isinstance(node, int) else getattr(node, "lineno", 0)
        return f"{self.shown}:{line}"

    def add(
        self, code: str, node: ast.AST | int, message: str, severity: Severity = "error"
    ) -> None:
        self.report.problems.append(
            Problem(
                code=code,
                severity=severity,
                check="static",
                location=self.at(node),
                message=message,
            )
        )

    # -- the checks ------------------------------------------------------------------------------

    def run(self) -> StaticReport:
        try:
            tree = ast.parse(self.path.read_bytes(), filename=str(self.path))
        except SyntaxError as exc:
            line = (exc.text or "").strip()
            shown = f": {line[:80]}" if line else ""
            self.add(
                "SYNTAX_ERROR", exc.lineno or 0, f"syntax error: {exc.msg}{shown}; fix the line"
            )
            return self.report
        except (OSError, ValueError) as exc:
            self.add("SOURCE_UNREADABLE", 0, f"cannot read the file: {exc}")
            return self.report
        self.imports = _import_map(tree)
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        cls = classes.get(self.class_name)
        if cls is None:
            if not _binds(tree, self.class_name):
                close = difflib.get_close_matches(self.class_name, list(classes), n=3)
                if close:
                    hint = f"; did you mean {', '.join(close)}?"
                elif classes:
                    hint = f"; classes defined there: {', '.join(sorted(classes))}"
                else:
                    hint = "; it defines no class"
                self.add(
                    "AGENT_NOT_FOUND",
                    1,
                    f"{self.shown} defines no {self.class_name!r}{hint}",
                )
            return self.report  # bound by an import or assignment: the dynamic checks decide
        self.report.class_location = self.at(cls)
        chain = _class_chain(cls, classes, self.imports)
        if chain is None:
            return self.report  # a base comes from another module: cannot tell from here
        if not chain:
            self.add(
                "NOT_A_SUBCLASS",
                cls,
                f"class {cls.name} does not derive from RolloutAgentLoop; write "
                f"`class {cls.name}(RolloutAgentLoop):`",
            )
            return self.report
        self.check_name(cls, chain)
        methods = _methods(chain)
        self.check_get_tools(cls, methods.get("get_tools"))
        run = methods.get("run")
        self.check_run_signature(cls, run)
        if isinstance(run, ast.AsyncFunctionDef):
            self.report.run_location = self.at(run)
            ctx_name = _param(run, 1)
            self.check_blocking(run)
            self.check_returns(run, ctx_name)
            self.check_history(run, ctx_name)
        return self.report

    def check_name(self, cls: ast.ClassDef, chain: list[ast.ClassDef]) -> None:
        for klass in chain:
            for stmt in klass.body:
                value = _assigned(stmt, "name")
                if value is None:
                    continue
                if isinstance(value, ast.Constant) and (
                    not isinstance(value.value, str) or not value.value.strip()
                ):
                    self.add(
                        "NAME_INVALID",
                        stmt,
                        f"`name` must be a non-empty string, got {value.value!r}; e.g. "
                        f'`name = "{cls.name.lower()}"`',
                    )
                return
        self.add(
            "NAME_MISSING",
            cls,
            f"class {cls.name} has no `name`; add a class attribute like "
            f'`name = "{cls.name.lower()}"` (TrainGate and /health show it)',
        )

    def check_get_tools(self, cls: ast.ClassDef, fn: ast.AST | None) -> None:
        if fn is None:
            self.add(
                "GET_TOOLS_MISSING",
                cls,
                f"class {cls.name} has no get_tools(self, request); add one that returns the "
                "rollout's tools (or [] for none)",
            )
        elif isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not _takes(fn, 2):
            self.add(
                "GET_TOOLS_SIGNATURE",
                fn,
                "get_tools must take exactly (self, request); give other parameters defaults",
            )

    def check_run_signature(self, cls: ast.ClassDef, fn: ast.AST | None) -> None:
        if fn is None:
            self.add(
                "RUN_MISSING",
                cls,
                f"class {cls.name} has no run(); add `async def run(self, ctx)` that ends with "
                "`return ctx.complete(messages)`",
            )
            return
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            return  # bound by an assignment (`run = shared_run`): the dynamic checks decide
        if isinstance(fn, ast.FunctionDef):
            self.add(
                "RUN_NOT_ASYNC",
                fn,
                "run must be a coroutine: write `async def run(self, ctx)` and await ctx.chat(...)",
            )
        if not _takes(fn, 2):
            self.add(
                "RUN_SIGNATURE",
                fn,
                "run must take exactly (self, ctx); give other parameters defaults",
            )

    def check_blocking(self, run: ast.AsyncFunctionDef) -> None:
        for node, qualified, what in blocking_calls(run, self.imports):
            self.add(
                "BLOCKING_CALL",
                node,
                f"{qualified}() blocks the event loop and stalls every other rollout "
                f"on this server; {what}",
                "warning",
            )

    def check_returns(self, run: ast.AsyncFunctionDef, ctx: str | None) -> None:
        if not _terminates(run.body):
            self.add(
                "NO_RESULT_RETURNED",
                run,
                "run() can reach its end without returning; end every path with "
                "`return ctx.complete(messages)` or `return ctx.error(message)`",
                "warning",
            )
        for node in _walk(run.body):
            if isinstance(node, ast.Return) and (
                node.value is None
                or (isinstance(node.value, ast.Constant) and node.value.value is None)
            ):
                self.add(
                    "NO_RESULT_RETURNED",
                    node,
                    "run() returns None here; return ctx.complete(messages) or ctx.error(message)",
                    "warning",
                )
            elif isinstance(node, ast.Expr) and _ctx_call(node.value, ctx, {"complete", "error"}):
                self.add(
                    "NO_RESULT_RETURNED",
                    node,
                    "the result of this ctx call is thrown away; write `return ctx.complete(...)`",
                    "warning",
                )

    def check_history(self, run: ast.AsyncFunctionDef, ctx: str | None) -> None:
        chats = [n for n in _walk(run.body) if _ctx_call(n, ctx, {"chat"})]
        if not chats:
            return
        names = {name for call in chats if (name := _history_arg(call))} or {"messages"}
        first_chat = min(getattr(c, "lineno", 0) for c in chats)
        looped = _loops_with_chat(run.body, ctx)
        fix = "append to the list instead (TrainGate trains on the exact tokens it sent)"
        for node in _walk(run.body):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in names:
                        late = node.lineno > first_chat or id(node) in looped
                        if late and node.value is not None and _rebuilds(node.value, target.id):
                            self.add(
                                "HISTORY_REBUILT",
                                node,
                                f"`{target.id}` is rebuilt after the first ctx.chat(); the "
                                f"history must only grow: {fix}",
                                "warning",
                            )
                    elif _root_name(target) in names:
                        self.add(
                            "HISTORY_REBUILT",
                            node,
                            f"a message in `{_root_name(target)}` is overwritten; {fix}",
                            "warning",
                        )
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    if _root_name(target) in names:
                        self.add(
                            "HISTORY_REBUILT",
                            node,
                            f"`del` removes messages from `{_root_name(target)}`; {fix}",
                            "warning",
                        )
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _EDITS
                and _root_name(node.func.value) in names
            ):
                self.add(
                    "HISTORY_REBUILT",
                    node,
                    f"`{_root_name(node.func.value)}.{node.func.attr}()` edits the history; {fix}",
                    "warning",
                )


# --------------------------------------------------------------------------------------------
# What the checks look for: the agent base class, blocking calls, ctx calls, history edits
# --------------------------------------------------------------------------------------------


def _class_chain(
    cls: ast.ClassDef, classes: dict[str, ast.ClassDef], imports: dict[str, str]
) -> list[ast.ClassDef] | None:
    """``cls`` and its same-file bases when it reaches RolloutAgentLoop; [] when it cannot;
    None when a base is defined elsewhere, so the answer is unknown."""
    chain: list[ast.ClassDef] = []
    seen: set[str] = set()
    reaches = False
    pending = [cls]
    while pending:
        klass = pending.pop(0)
        if klass.name in seen:
            continue
        seen.add(klass.name)
        chain.append(klass)
        for base in klass.bases:
            dotted = _dotted(base)
            if dotted is None:
                return None
            origin = imports.get(dotted.split(".")[0], dotted)
            if dotted.split(".")[-1] == _BASE or origin.endswith(f".{_BASE}"):
                reaches = True
            elif dotted in classes:
                pending.append(classes[dotted])
            elif dotted in vars(builtins) or dotted in ("ABC", "abc.ABC", "Generic"):
                continue
            else:
                return None
    return chain if reaches else []


_URLOPEN = ("urllib.request.urlopen", "urllib2.urlopen")
#: httpx2 is named with what it is: a newcomer has never heard of it.
_ASYNC_HTTP = (
    "use an async HTTP client: httpx2 (installed with osmosis-rollout; the maintained "
    "continuation of httpx), e.g. `async with httpx2.AsyncClient() as http: "
    "reply = await http.get(url)`"
)


def blocking_calls(
    fn: ast.AsyncFunctionDef, imports: dict[str, str]
) -> list[tuple[ast.Call, str, str]]:
    """The calls in ``fn``'s body (not its nested functions) that block the event loop: each
    with its qualified name and the advice. Only names the file imports (or the builtin
    ``open``) count: a local ``requests`` list or ``socket`` dict is not the module."""
    found = []
    for node in _walk(fn.body):
        if isinstance(node, ast.Call):
            head = (_dotted(node.func) or "").partition(".")[0]
            imported = head in imports or head == "open"
            qualified = _qualify(node.func, imports) if imported else None
            what = _blocking(qualified) if qualified else None
            if qualified and what:
                found.append((node, qualified, what))
    return found


def _blocking(name: str) -> str | None:
    """How to avoid the blocking call ``name``, or None when it does not block."""
    module, _, func = name.rpartition(".")
    if name == "time.sleep":
        return "use `await anyio.sleep(...)` (or asyncio.sleep)"
    if module == "requests" or name.startswith("requests.") or name in _URLOPEN:
        return _ASYNC_HTTP
    if module == "subprocess" and func in _SUBPROCESS:
        return "use `await anyio.run_process(...)`"
    if name in ("open", "io.open"):
        return "read files before the rollout, or use `await anyio.Path(...).read_text()`"
    if name.startswith("socket."):
        return "use anyio's async sockets (anyio.connect_tcp)"
    return None


def _ctx_call(node: ast.AST, ctx: str | None, methods: set[str]) -> bool:
    """Whether ``node`` is ``ctx.<method>(...)`` (optionally awaited)."""
    if isinstance(node, ast.Await):
        node = node.value
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in methods
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == (ctx or "ctx")
    )


def _history_arg(call: ast.AST) -> str | None:
    if isinstance(call, ast.Await):
        call = call.value
    if not isinstance(call, ast.Call):
        return None
    arg = (
        call.args[0]
        if call.args
        else next((k.value for k in call.keywords if k.arg == "messages"), None)
    )
    return arg.id if isinstance(arg, ast.Name) else None


def _loops_with_chat(body: list[ast.stmt], ctx: str | None) -> set[int]:
    """ids of statements inside a loop whose body also calls ``ctx.chat``."""
    inside: set[int] = set()
    for node in _walk(body):
        if isinstance(node, ast.For | ast.AsyncFor | ast.While):
            nodes = list(_walk(node.body))
            if any(_ctx_call(n, ctx, {"chat"}) for n in nodes):
                inside.update(id(n) for n in nodes)
    return inside


def _rebuilds(value: ast.expr, name: str) -> bool:
    """Whether assigning ``value`` to ``name`` replaces the history instead of extending it."""
    if isinstance(value, ast.List | ast.ListComp | ast.Subscript):
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        left = value.left
        return not (isinstance(left, ast.Name) and left.id == name)
    return False
