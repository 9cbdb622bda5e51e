"""What a new user meets first: the Gymnasium id in a fresh interpreter, the spec's episode limit, no render
warning, `verified` always a bool, `steptp --version` and the package's one version number, the public
imports the README shows."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from typer.testing import CliRunner

import steptp_env
from steptp_env.cli import app

FRESH = """
import sys, warnings
warnings.simplefilter("error", UserWarning)  # gymnasium's render-fps notice is a UserWarning
import gymnasium
assert "steptp_env" not in sys.modules
env = gymnasium.make("steptp_env:steptp_env/StepTP-v1", workload="level1/relu", preset="tiny", mode="model",
                     store=sys.argv[1])
obs, info = env.reset(seed=0)
_, _, _, _, info = env.step(0)  # index 0 is the stop action: no program, nothing verified
print(env.spec.max_episode_steps, type(info["verified"]).__name__)
"""


def test_the_module_prefixed_id_works_in_a_fresh_interpreter(tmp_path):
    done = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path / "s.sqlite")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["32", "bool"]
    assert "render fps" not in done.stderr


def test_an_error_step_says_verified_false(tmp_path):
    from steptp_env.env import StepTPEnv

    env = StepTPEnv("level1/relu", "tiny", mode="model", action_mode="text", store=tmp_path / "s.sqlite")
    env.reset(seed=0)
    info = env.step("loop_split(nest=9, loop=z, factor=3)")[4]
    assert info["error"] and info["verified"] is False


def test_one_version_number():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"steptp_env {steptp_env.__version__}"
    assert importlib.metadata.version("steptp-env") == steptp_env.__version__


def test_the_recorder_is_importable_from_the_data_package():
    from steptp_env.data import Recorder
    from steptp_env.data.recorder import Recorder as Defined

    assert Recorder is Defined


def test_a_missing_input_file_is_one_line_of_error(tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    for command in (["import", missing], ["validate-rows", missing], ["export", missing, "--out", str(tmp_path)],
                    ["train-llm", missing, "--out", str(tmp_path / "o")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and "does not exist" in result.output, (command, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), command


def test_the_readme_headline_program_runs_as_written():
    """The README's first LEIR program, by the command the README gives for it."""
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith(".venv/bin/steptp leir run"))
    headline = readme.split("```\n", 2)[1].strip()
    args = shlex.split(command)[1:]
    assert args[2] == headline
    result = CliRunner().invoke(app, [*args, "--repeat", "2"])
    assert result.exit_code == 0, result.output
    assert "median" in result.output
