"""Test tiers: `model`, `subprocess`, `tui` and `slow`, given by folder (tests/tui/), by
fixture (those that load the bundled model) or by the test's own mark; and the fast tier
(`pytest --fast`: none of those), in which loading a model or starting Python or tmux
fails the test, naming the mark it lacks, so the tier cannot silently grow slow."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

TIERS = ("model", "subprocess", "tui", "slow")  # what the fast tier leaves out
# Session fixtures that load the bundled model (tests/conftest.py)
MODEL_FIXTURES = {"engine", "exact_engine", "small_engine", "torch_engine", "hf_dir"}
TESTS_DIR = Path(__file__).resolve().parents[1]
TUI_DIR = TESTS_DIR / "tui"


def add_option(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="run only the fast tier: tests marked none of " + ", ".join(TIERS)
                          + "; one that loads a model or starts Python fails")


def mark_and_select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the tier marks each test needs; under --fast, deselect every marked test."""
    for item in items:
        for name in needs(item):
            item.add_marker(name)
    if not config.getoption("fast"):
        return
    keep, dropped = [], []
    for item in items:
        (dropped if any(item.get_closest_marker(t) for t in TIERS) else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def needs(item: pytest.Item) -> set[str]:
    """The tier marks a test gets from where it is and what it uses: tests/tui/ is `tui`,
    a fixture that loads the bundled model makes it `model`. Everything else says its tier
    itself (@pytest.mark.model, pytestmark = ...), and the fast tier's guard fails a test
    that does not."""
    out = set()
    if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
        out.add("model")
    if TUI_DIR in Path(item.path).resolve().parents:
        out.add("tui")
    return out


def guard_fast_tier(config: pytest.Config) -> None:
    """Under --fast, make every model load, and every start of Python (the CLI, a server)
    or tmux, fail the running test, naming the mark it lacks. Process-wide for the rest of
    the run (module fixtures are set up before function ones): it selected only unmarked
    tests. Small tools (uname, a compiler) may still run. Under pytest-xdist, in each worker
    (the controller starts them and runs no test)."""
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if not config.getoption("fast") or controller:
        return
    from llama_cpp._internals import LlamaModel as LlamaCppModel

    from localchat.engine.executors.torch.model import LlamaModel as TorchModel

    LlamaCppModel.__new__ = _refuse("loads a model through llama.cpp", "model")
    TorchModel.__new__ = _refuse("builds a torch model", "model")
    popen_new = subprocess.Popen.__new__
    refuse_popen = _refuse("starts a process", "subprocess")

    def checked_popen(cls, args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = Path(os.fsdecode(argv[0]).split()[0]) if argv else Path()
        if (program.name.startswith(("python", "localchat", "tmux"))
                or program.parent == Path(sys.executable).parent):
            refuse_popen(cls, args)
        return popen_new(cls)

    subprocess.Popen.__new__ = staticmethod(checked_popen)


def _refuse(what: str, mark: str):
    """A __new__ that fails the running test (so no half-built object is ever finalized)."""
    def new(cls, *args, **kwargs):  # noqa: ARG001
        caller = next((f for f in reversed(traceback.extract_stack())
                       if TESTS_DIR in Path(f.filename).parents
                       and Path(f.filename).name != "tiers.py"), None)
        where = f" ({Path(caller.filename).name}:{caller.lineno})" if caller else ""
        pytest.fail(f"a fast-tier test {what}{where}: mark it @pytest.mark.{mark} "
                    f"(or use a fixture that is)", pytrace=False)
    return staticmethod(new)
