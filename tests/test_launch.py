"""``osmosis test --launch CMD`` (``evaluation/launch.py``): a server started the way the
platform starts one, on a free port it is told through ``_OSMOSIS_ROLLOUT_PORT``, waited for on
``/health``, and always stopped. The servers here are written with nothing but Starlette: no
part of ours may be assumed of a server we launch."""

from __future__ import annotations

import io
import os
import shlex
import sys
import threading
from pathlib import Path

import anyio
import httpx2
import pytest

from osmosis_rollout.errors import LaunchError
from osmosis_rollout.evaluation.launch import LaunchSpec, launch, split_command

from .support import ASSETS

pytestmark = pytest.mark.anyio

SERVER = ASSETS / "foreign" / "starlette_health.py"


def _command(mode: str = "serve") -> str:
    return shlex.join([sys.executable, str(SERVER), mode])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    )


async def test_a_launched_server_is_told_its_port_answers_and_is_stopped(tmp_path: Path) -> None:
    async with launch(LaunchSpec(_command(), cwd=tmp_path)) as server:
        reply = httpx2.get(f"{server.url}/health", timeout=5)
        assert reply.status_code == 200
        assert reply.json()["instance_id"] == server.instance_id
        pid = server.process.pid
        said = f"serving on {server.port} (ROLLOUT_PORT={server.port}, OSMOSIS_HOST=127.0.0.1)"
        assert said in server.last_lines()
    assert server.process.returncode is not None
    assert not _alive(pid)


async def test_a_server_that_dies_is_an_error_naming_the_command_code_and_output(
    tmp_path: Path,
) -> None:
    with pytest.raises(LaunchError) as caught:
        async with launch(LaunchSpec(_command("die"), cwd=tmp_path)):
            pytest.fail("a dead server was yielded")
    message = str(caught.value)
    assert "exited with code 3" in message
    assert str(SERVER) in message
    assert "RuntimeError: the dataset is missing" in message


async def test_a_server_missing_a_module_is_told_which_python_ran_it(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("import osmosis_test_no_such_module\n")
    command = shlex.join([sys.executable, "main.py"])
    spec = LaunchSpec(command, cwd=tmp_path, environment_hint="or make a venv where it lives")
    with pytest.raises(LaunchError) as caught:
        async with launch(spec):
            pytest.fail("a dead server was yielded")
    message = str(caught.value)
    assert "No module named 'osmosis_test_no_such_module'" in message  # its own last lines
    hint = message.split("\nHint: ", 1)[1]
    assert hint.startswith(
        f"the Python {sys.executable} has no module 'osmosis_test_no_such_module': run the "
        "server in the rollout's own environment"
    )
    assert '--launch "<its venv>/bin/python main.py"' in hint
    assert '--launch "uv run python main.py"' in hint
    assert hint.endswith("; or make a venv where it lives")


async def test_a_server_that_dies_otherwise_gets_no_module_hint(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        async with launch(LaunchSpec(_command("die"), cwd=tmp_path, environment_hint="venv")):
            pytest.fail("a dead server was yielded")
    assert "Hint" not in str(caught.value)


async def test_a_server_that_never_answers_times_out_with_its_output(tmp_path: Path) -> None:
    spec = LaunchSpec(_command("silent"), cwd=tmp_path, startup_timeout_s=3)
    with pytest.raises(LaunchError) as caught:
        async with launch(spec):
            pytest.fail("a silent server was yielded")
    message = str(caught.value)
    assert "did not answer" in message
    assert "_OSMOSIS_ROLLOUT_PORT" in message
    assert "serving on" in message


async def test_a_server_ignoring_sigterm_is_killed_after_the_bound(tmp_path: Path) -> None:
    spec = LaunchSpec(_command("stubborn"), cwd=tmp_path, stop_timeout_s=0.5)
    with anyio.fail_after(30):
        async with launch(spec) as server:
            pid = server.process.pid
    assert not _alive(pid)


async def test_an_error_inside_the_run_still_stops_the_server(tmp_path: Path) -> None:
    pids: list[int] = []

    async def run() -> None:
        async with launch(LaunchSpec(_command(), cwd=tmp_path)) as server:
            pids.append(server.process.pid)
            raise RuntimeError("inside the run")

    with pytest.raises(RuntimeError, match="inside"):
        await run()
    assert pids
    assert not _alive(pids[0])


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("", "needs a command"),
        ("python 'unclosed", "cannot be split"),
        ("/no/such/program --port 1", "could not start"),
    ],
)
async def test_a_command_that_cannot_start_is_a_clear_error(
    tmp_path: Path, command: str, said: str
) -> None:
    async def run() -> None:
        async with launch(LaunchSpec(command, cwd=tmp_path)):
            pytest.fail("nothing was started")

    with pytest.raises(LaunchError, match=said):
        await run()


def test_split_command_splits_like_a_shell() -> None:
    assert split_command("uv run python 'my main.py'") == ["uv", "run", "python", "my main.py"]


ELSEWHERE = """
import time

print("INFO:     Uvicorn running on http://127.0.0.1:9000 (Press CTRL+C to quit)", flush=True)
time.sleep(120)
"""


async def test_a_server_that_says_it_listens_on_another_port_is_named_early(
    tmp_path: Path,
) -> None:
    """A command with its own ``--port`` (or a main that ignores the variable) says where it
    listens: the error quotes that line and says what to change, long before the startup
    bound (120 s by default)."""
    script = tmp_path / "fixed_port.py"
    script.write_text(ELSEWHERE)
    spec = LaunchSpec(shlex.join([sys.executable, str(script)]), cwd=tmp_path)
    with anyio.fail_after(60), pytest.raises(LaunchError) as caught:
        async with launch(spec):
            pytest.fail("a server on another port was yielded")
    message = str(caught.value)
    assert "listens on another port" in message
    assert "Uvicorn running on http://127.0.0.1:9000" in message
    assert "_OSMOSIS_ROLLOUT_PORT" in message


class _BlockedStderr(io.StringIO):
    """A stderr nobody reads (a full pipe): every write waits until ``free`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.free = threading.Event()

    def write(self, text: str) -> int:
        self.free.wait()
        return super().write(text)


async def test_an_echoed_server_never_blocks_on_a_stderr_that_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``echo`` (``--verbose``) and a stderr that blocks, a server printing more than a
    pipe holds still starts: its output keeps being read, the lines stderr cannot take are
    dropped (and said to be), and none is lost from the lines kept for errors."""
    blocked = _BlockedStderr()
    monkeypatch.setattr(sys, "stderr", blocked)
    try:
        async with launch(LaunchSpec(_command("chatty"), cwd=tmp_path, echo=True)) as server:
            reply = httpx2.get(f"{server.url}/health", timeout=5)
            assert reply.status_code == 200
            assert "chatty: done" in server.last_lines(40)
    finally:
        blocked.free.set()


async def test_echoed_lines_are_marked_and_carry_no_key_of_the_servers_environment(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each line echoed is marked as the server's; a key in its environment is scrubbed."""
    key = "sk-foreign-0123456789"
    spec = LaunchSpec(_command("chatty"), cwd=tmp_path, env={"FOREIGN_API_KEY": key}, echo=True)
    async with launch(spec):
        pass
    err = capfd.readouterr().err
    assert "server| settings: FOREIGN_API_KEY=**********" in err
    assert "server| line 4999 " in err
    assert key not in err
