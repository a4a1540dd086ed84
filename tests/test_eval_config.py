"""``osmosis test --config configs/eval/NAME.toml`` (``evaluation/eval_config.py``): an official
osmosis-ai 0.3 eval config read into our options, with what we do not use listed."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from osmosis_rollout.errors import ConfigError
from osmosis_rollout.evaluation.eval_config import read_eval_config

CONFIG = """\
[experiment]
rollout = "multiply"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "multiply"
branch = "main"

[evaluation]
n = 4
pass_threshold = 0.5
limit = 10
batch_size = 8
agent_workflow_timeout_s = 120
grader_timeout_s = 30

[env]
MULTIPLY_HINTS = "off"
RETRIES = 3

[secrets]
names = ["OPENAI_API_KEY"]
"""


def _workspace(tmp_path: Path, text: str = CONFIG) -> Path:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    (tmp_path / "rollouts" / "multiply").mkdir(parents=True)
    (tmp_path / "rollouts" / "multiply" / "main.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "multiply.jsonl").write_text('{"messages": []}\n')
    config = tmp_path / "configs" / "eval" / "multiply.toml"
    config.write_text(text)
    return config


def test_an_official_eval_config_becomes_our_options(tmp_path: Path) -> None:
    config = read_eval_config(_workspace(tmp_path))
    assert config.workspace == tmp_path.resolve()
    assert (config.samples, config.pass_threshold, config.limit) == (4, 0.5, 10)
    assert (config.agent_timeout_s, config.grader_timeout_s) == (120.0, 30.0)
    assert config.dataset_path() == tmp_path.resolve() / "data" / "multiply.jsonl"
    assert config.rollout_dir == tmp_path.resolve() / "rollouts" / "multiply"
    assert config.env == {"MULTIPLY_HINTS": "off", "RETRIES": "3"}
    assert config.model_path == "openai/gpt-5-mini"


def test_what_we_do_not_use_is_listed(tmp_path: Path) -> None:
    config = read_eval_config(_workspace(tmp_path))
    assert config.unused == ("evaluation.batch_size", "experiment.branch", "secrets")


def test_a_secrets_table_that_asks_for_none_is_not_listed(tmp_path: Path) -> None:
    """The workspace scaffold's config has ``[secrets] required = []``: nothing is asked for,
    so nothing is ignored (a cold trial saw ``not used: secrets`` on every run)."""
    text = CONFIG.replace('names = ["OPENAI_API_KEY"]', "required = []")
    config = read_eval_config(_workspace(tmp_path, text))
    assert config.unused == ("evaluation.batch_size", "experiment.branch")


def test_the_launch_command_prefers_the_rollouts_own_virtualenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _workspace(tmp_path)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert read_eval_config(path).launch_command() == shlex.join([sys.executable, "main.py"])
    own = tmp_path / "rollouts" / "multiply" / ".venv" / "bin"
    own.mkdir(parents=True)
    (own / "python").write_text("")
    assert read_eval_config(path).launch_command() == shlex.join([str(own / "python"), "main.py"])


def test_a_platform_dataset_not_in_the_workspace_asks_for_dataset(tmp_path: Path) -> None:
    path = _workspace(tmp_path, CONFIG.replace('dataset = "multiply"', 'dataset = "gsm8k-v3"'))
    assert read_eval_config(path).dataset_path() is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[evaluation\nn = 1\n", "not valid TOML"),
        ("[evaluation]\nn = 0\n", "n must be a whole number"),
        ("[evaluation]\nn = true\n", "n must be a whole number"),
        ("[evaluation]\ngrader_timeout_s = nan\n", "finite number"),
        ("[evaluation]\nagent_workflow_timeout_s = -1\n", "more than 0"),
        ("[experiment]\nrollout = 3\n", "rollout must be a non-empty string"),
        ("evaluation = 3\n", "[evaluation] must be a table"),
    ],
)
def test_a_malformed_config_is_a_clear_error(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_eval_config(path)
    assert said in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_eval_config(tmp_path / "configs" / "eval" / "nope.toml")
