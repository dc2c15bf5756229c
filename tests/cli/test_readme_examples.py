"""The README's first `localchat run` example, run as a user types it, on the bundled model:
it must answer right (the first thing a new user runs shows the model at its best)."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest

from localchat.cli import main

pytestmark = pytest.mark.model  # runs the bundled model

README = Path(__file__).resolve().parents[2] / "README.md"


def run_examples() -> list[list[str]]:
    """Each `localchat run ...` line of the README's "Run one prompt" block, as argv."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"## Run one prompt.*?```sh\n(.*?)```", text, re.S)
    assert block, "the README lost its run examples"
    lines = [line.split("  #")[0].strip() for line in block[1].splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("localchat run ")]


def test_the_first_run_example_answers_right(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # as from a terminal: nothing piped
    argv = run_examples()[0]
    assert argv[0] == "run" and "--temp" in argv
    assert main(argv) == 0
    assert "Paris" in capsys.readouterr().out
