"""The test helper's warm `python -m localchat` (helpers/warm_cli.py, a fork of a process that
imported torch and llama_cpp already) answers as the cold command does: same exit code,
stdout and stderr, with the test's stdin, environment and working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import warm_cli


def cold(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localchat", *args], input=stdin,
                          capture_output=True, text=True, timeout=180, env=env or os.environ)


def warm(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    return warm_cli.run(list(args), input=stdin, env=env or dict(os.environ), timeout=180)


def same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> None:
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def test_a_greedy_run_with_stdin_is_the_cold_commands_reply():
    args = ("run", "Repeat it.", "-n", "8", "--temp", "0", "--json", "-c", "256")
    stdin = "The capital of France is Paris.\n"
    a, b = cold(*args, stdin=stdin), warm(*args, stdin=stdin)
    assert a.returncode == 0, a.stderr
    keep = ("text", "prompt_tokens", "completion_tokens", "finish_reason", "engine", "model")
    first, second = json.loads(a.stdout), json.loads(b.stdout)
    assert {k: first[k] for k in keep} == {k: second[k] for k in keep}
    assert first["prompt_tokens"] > 10 and first["completion_tokens"] > 0  # stdin was read
    assert a.stderr == b.stderr == ""


def test_an_error_exit_code_and_the_environment_are_the_cold_commands(tmp_path):
    long = "Hello there, how are you today? Please tell me about your day in great detail."
    same(cold("run", "-c", "32", long), warm("run", "-c", "32", long))
    # the environment is the request's: a bad LOCALCHAT_HOME read by localchat, fresh
    home = tmp_path / "a-file"
    home.write_text("not a directory")
    env = {**os.environ, "LOCALCHAT_HOME": str(home)}
    a, b = cold("run", "--continue", "Hi", "-n", "2", env=env), warm("run", "--continue", "Hi",
                                                                       "-n", "2", env=env)
    same(a, b)
    assert a.returncode != 0 and str(home) in a.stderr


def test_a_command_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        warm_cli.run(["run", "-", "-n", "1"], input="", env=dict(os.environ), timeout=0.01)


@pytest.mark.subprocess
def test_a_command_with_its_own_pythonpath_starts_cold(tmp_path):
    """The interpreter reads PYTHONPATH as it starts, which a fork cannot redo."""
    (tmp_path / "sitecustomize.py").write_text("import sys; print('site of tmp', file=sys.stderr)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = warm("--version", env=env)
    assert proc.returncode == 0 and proc.stderr == "site of tmp\n", proc.stderr
