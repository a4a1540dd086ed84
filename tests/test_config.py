"""``ServerSettings.resolve``: CLI > env > [tool.osmosis.serve] > [tool.osmosis] > defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.config import ServerSettings, find_pyproject, read_pyproject_table
from osmosis_rollout.errors import ConfigError

PYPROJECT = """
[project]
name = "my-agent"

[tool.osmosis]
agent = "agent.py:MyAgent"
max_concurrent = 11
rollout_timeout_s = 11.0
record_ttl_s = 11.0
shutdown_grace_s = 11.0

[tool.osmosis.serve]
max-concurrent = 22
rollout-timeout-s = 22.0
record_ttl_s = 22.0

[tool.osmosis.test]
max_concurrent = 99
"""


def write(tmp_path: Path, text: str) -> Path:
    """Write ``pyproject.toml`` into ``tmp_path``."""
    path = tmp_path / "pyproject.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_match_the_protocol() -> None:
    """With no sources, the settings are protocol.md's defaults on loopback."""
    settings = ServerSettings.resolve()

    assert settings.host == "127.0.0.1"
    assert settings.port == 9000
    assert settings.api_key is None
    assert settings.max_concurrent == 100
    assert settings.max_queued == 10_000
    assert settings.rollout_timeout_s == 3600
    assert settings.record_ttl_s == 3600
    assert settings.shutdown_grace_s == 30
    assert settings.max_metadata_bytes == 1024 * 1024


def test_precedence_cli_env_serve_table_shared_table_defaults(tmp_path: Path) -> None:
    """Each setting comes from the highest source that gives it; dashes equal underscores."""
    pyproject = write(tmp_path, PYPROJECT)
    settings = ServerSettings.resolve(
        {"max_concurrent": 44, "rollout_timeout_s": None},
        environ={"OSMOSIS_MAX_CONCURRENT": "33", "OSMOSIS_ROLLOUT_TIMEOUT_S": "33"},
        pyproject=pyproject,
    )

    assert settings.max_concurrent == 44  # CLI beats all
    assert settings.rollout_timeout_s == 33  # env beats pyproject; a None CLI value is "unset"
    assert settings.record_ttl_s == 22  # [tool.osmosis.serve] beats [tool.osmosis]
    assert settings.shutdown_grace_s == 11  # [tool.osmosis] beats defaults
    assert settings.max_queued == 10_000  # the default


def test_other_command_tables_do_not_leak_into_serve(tmp_path: Path) -> None:
    """[tool.osmosis.test] applies to `osmosis test` only."""
    pyproject = write(tmp_path, "[tool.osmosis.test]\nmax_concurrent = 99\n")

    assert ServerSettings.resolve(pyproject=pyproject).max_concurrent == 100


def test_api_key_from_environment_stays_secret() -> None:
    """OSMOSIS_API_KEY is picked up and never shown in repr or a plain dump."""
    settings = ServerSettings.resolve(environ={"OSMOSIS_API_KEY": "s3cr3t-key"})

    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == "s3cr3t-key"
    assert "s3cr3t-key" not in repr(settings)
    assert "s3cr3t-key" not in settings.model_dump_json()


def test_empty_environment_values_are_ignored() -> None:
    """An empty OSMOSIS_* variable means "not set", not an invalid value (the key aside)."""
    settings = ServerSettings.resolve(environ={"OSMOSIS_PORT": "", "OSMOSIS_STATE": ""})

    assert settings.port == 9000
    assert settings.api_key is None


@pytest.mark.parametrize(
    ("source", "place"),
    [
        ("environ", "OSMOSIS_API_KEY"),
        ("cli", "--api-key"),
        ("pyproject", "[tool.osmosis.serve]"),
    ],
)
def test_a_blank_server_key_is_refused_wherever_it_comes_from(
    tmp_path: Path, source: str, place: str
) -> None:
    """``OSMOSIS_API_KEY=""``, ``--api-key "$UNSET"``, ``api_key = ""``: a blank key used to
    mean "no auth" while the banner said "auth on"; now it is an error saying how to turn auth
    off on purpose."""
    kwargs: dict[str, Any] = {"flags": {"api_key": "--api-key"}}
    if source == "environ":
        kwargs["environ"] = {"OSMOSIS_API_KEY": ""}
    elif source == "cli":
        kwargs["cli"] = {"api_key": "  "}
    else:
        kwargs["pyproject"] = write(tmp_path, '[tool.osmosis]\napi_key = ""\n')

    with pytest.raises(ConfigError) as caught:
        ServerSettings.resolve(**kwargs)

    message = str(caught.value)
    assert "blank" in message
    assert "--no-auth" in message
    assert place in message


def test_allow_lists_come_from_flags_the_environment_and_pyproject(tmp_path: Path) -> None:
    """``--traingate``/``--allow-origin``/``--allow-host`` take lists; the environment a comma
    or space separated string; ``[tool.osmosis]`` a TOML list."""
    pyproject = write(tmp_path, '[tool.osmosis]\ntraingate = ["tg.internal:8000"]\n')
    settings = ServerSettings.resolve(
        {"allow_origin": ["https://ui.example"]},
        environ={"OSMOSIS_ALLOW_HOST": "rollouts.internal, other.internal"},
        pyproject=pyproject,
    )

    assert settings.traingate == ("tg.internal:8000",)
    assert settings.allow_origin == ("https://ui.example",)
    assert settings.allow_host == ("rollouts.internal", "other.internal")


def test_a_malformed_traingate_entry_is_a_config_error() -> None:
    """A bad port in the allow-list is refused at start, naming the setting."""
    with pytest.raises(ConfigError, match=r"traingate.*invalid port"):
        ServerSettings.resolve(environ={"OSMOSIS_TRAINGATE": "tg.internal:99999"})


def test_unknown_key_in_the_serve_table_is_rejected(tmp_path: Path) -> None:
    """A typo in [tool.osmosis.serve] is a ConfigError naming the key and the known ones."""
    pyproject = write(tmp_path, "[tool.osmosis.serve]\nmax_concurent = 5\n")

    with pytest.raises(ConfigError) as caught:
        ServerSettings.resolve(pyproject=pyproject)

    message = str(caught.value)
    assert "unknown setting 'max_concurent' in [tool.osmosis.serve]" in message
    assert "max_concurrent" in message.split("known:")[1]
    assert str(pyproject) in message


def test_unknown_shared_keys_are_left_to_other_commands(tmp_path: Path) -> None:
    """[tool.osmosis] is shared: keys meant for other commands (agent, dataset) are fine."""
    pyproject = write(tmp_path, '[tool.osmosis]\nagent = "a.py:A"\ndataset = "rows.jsonl"\n')

    assert ServerSettings.resolve(pyproject=pyproject).port == 9000


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"port": 70000}, "port"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"rollout_timeout_s": -1}, "rollout_timeout_s"),
        ({"log_level": "loud"}, "log_level"),
        ({"max_queued": "many"}, "max_queued"),
    ],
)
def test_invalid_cli_values_are_config_errors(source: dict[str, object], field: str) -> None:
    """An out-of-range or mistyped value is a ConfigError naming the setting."""
    with pytest.raises(ConfigError, match=rf"invalid settings: {field} \(OSMOSIS_{field.upper()}"):
        ServerSettings.resolve(source)


def test_invalid_environment_value_is_a_config_error() -> None:
    """A bad OSMOSIS_* value is reported like a bad flag, without echoing it."""
    with pytest.raises(ConfigError, match=r"invalid settings: port \(OSMOSIS_PORT") as caught:
        ServerSettings.resolve(environ={"OSMOSIS_PORT": "ninety"})

    assert "ninety" not in str(caught.value)


def test_invalid_pyproject_value_is_a_config_error(tmp_path: Path) -> None:
    """A bad value in pyproject.toml is a ConfigError too."""
    pyproject = write(tmp_path, "[tool.osmosis.serve]\nshutdown-grace-s = -5\n")

    with pytest.raises(ConfigError, match="shutdown_grace_s"):
        ServerSettings.resolve(pyproject=pyproject)


def test_unreadable_toml_is_a_config_error(tmp_path: Path) -> None:
    """Broken TOML names the file instead of raising a parser traceback."""
    pyproject = write(tmp_path, "[tool.osmosis\n")

    with pytest.raises(ConfigError, match=r"cannot read .*pyproject\.toml"):
        ServerSettings.resolve(pyproject=pyproject)


def test_osmosis_table_must_be_a_table(tmp_path: Path) -> None:
    """`[tool] osmosis = 3` is refused with a clear message."""
    pyproject = write(tmp_path, "[tool]\nosmosis = 3\n")

    with pytest.raises(ConfigError, match=r"\[tool.osmosis\] must be a table"):
        read_pyproject_table(pyproject, "serve", allowed=ServerSettings.model_fields)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tool.osmosis]\nserve = "fast"\n', r"\[tool.osmosis.serve\] must be a table"),
        ("tool = 3\n", r"\[tool.osmosis\] must be a table"),
    ],
)
def test_a_section_that_is_not_a_table_is_a_config_error(
    tmp_path: Path, text: str, message: str
) -> None:
    """`serve = "fast"` or `tool = 3` is a ConfigError, not an AttributeError traceback."""
    pyproject = write(tmp_path, text)

    with pytest.raises(ConfigError, match=message):
        ServerSettings.resolve(pyproject=pyproject)


def test_find_pyproject_walks_up_from_a_file_or_directory(tmp_path: Path) -> None:
    """The nearest pyproject.toml at or above the start (a file or a directory) is found."""
    pyproject = write(tmp_path, PYPROJECT)
    nested = tmp_path / "src" / "pkg"
    nested.mkdir(parents=True)
    agent = nested / "agent.py"
    agent.write_text("", encoding="utf-8")

    assert find_pyproject(nested) == pyproject.resolve()
    assert find_pyproject(agent) == pyproject.resolve()
    inner = write(nested, "[project]\nname = 'inner'\n")
    assert find_pyproject(agent) == inner.resolve()


def test_errors_name_the_flag_when_one_sets_the_setting() -> None:
    """With ``flags``, an error names the flag, the variable and the pyproject table."""
    with pytest.raises(ConfigError) as caught:
        ServerSettings.resolve({"port": 70000}, flags={"port": "--port"})
    assert "port (--port, OSMOSIS_PORT or [tool.osmosis.serve])" in str(caught.value)


#: Runtime dependencies we declare without importing them, and why.
NOT_IMPORTED = {"sniffio": "httpx2's ASGITransport imports it on every request"}


def test_every_declared_dependency_is_imported() -> None:
    """A dependency in [project.dependencies] is one ``src`` imports (settings are resolved by
    ``ServerSettings.resolve``, not pydantic-settings, so that one is not declared)."""
    import ast
    import re
    import tomllib

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[\[<>=~!; ]", dep, maxsplit=1)[0].lower() for dep in declared}
    imported: set[str] = set()
    for path in (root / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    unused = {n for n in names if n.replace("-", "_") not in imported} - set(NOT_IMPORTED)
    assert unused == set()


def test_the_polling_lease_must_outlast_the_result_wait() -> None:
    """A controller renews its lease by polling: a lease shorter than one wait would lapse."""
    with pytest.raises(ConfigError, match=r"poll_lease_s \(OSMOSIS_POLL_LEASE_S"):
        ServerSettings.resolve(
            {}, environ={"OSMOSIS_POLL_WAIT_S": "30", "OSMOSIS_POLL_LEASE_S": "30"}
        )
    settings = ServerSettings.resolve(
        {}, environ={"OSMOSIS_POLL_WAIT_S": "1", "OSMOSIS_POLL_LEASE_S": "3"}
    )
    assert (settings.poll_wait_s, settings.poll_lease_s, settings.poll_retention_s) == (1, 3, 900)
