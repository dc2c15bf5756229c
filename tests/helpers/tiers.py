"""Test tiers: marks each test `model`, `subprocess` or `tui` by what it needs, and the
fast tier (`pytest --fast`: none of those, nor `slow`), in which loading a model or
starting Python or tmux fails the test, so the tier cannot silently grow slow."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import traceback
from pathlib import Path
from types import CodeType, FunctionType

import pytest

TIERS = ("model", "subprocess", "tui", "slow")  # what the fast tier leaves out
# Session fixtures that load the bundled model (tests/conftest.py)
MODEL_FIXTURES = {"engine", "small_engine", "torch_engine", "hf_dir"}
# (module, name) of what a test uses that loads a model or starts a process
MODEL_CALLS = {("localchat.engine", "open_engine"), ("localchat.engine", "load_engine"),
               ("llama_cpp.llama", "Llama"),
               ("localchat.engine.executors.torch.model", "LlamaModel"),
               ("localchat.engine.executors.llamacpp", "LlamaCppExecutor"),
               ("localchat.models.specs", "resolve_model"),  # the bundled model's file
               (None, "llama_cpp")}  # the llama_cpp module itself
SUBPROCESS_CALLS = {("helpers.cli", "localchat"), ("helpers.server", "ServerProcess"),
                    (None, "subprocess")}  # the subprocess module itself
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
    """The tier marks that can be seen without running the test: its fixtures (all of
    them, through other fixtures), its directory, and what its function and its module's
    fixtures call by name, following functions defined under tests/."""
    out = set()
    fixtures = set(getattr(item, "fixturenames", ()))
    if MODEL_FIXTURES & fixtures:
        out.add("model")
    if TUI_DIR in Path(item.path).resolve().parents:
        out.add("tui")
    module = getattr(item, "module", None)
    funcs = [getattr(item, "function", None)] + [
        getattr(module, name, None) for name in fixtures if module is not None]
    called: set[tuple[str, str]] = set()
    seen: set[CodeType] = set()
    for func in funcs:
        _calls(func, called, seen)
    if called & MODEL_CALLS:
        out.add("model")
    if called & SUBPROCESS_CALLS:
        out.add("subprocess")
    return out


def _calls(obj, out: set[tuple[str, str]], seen: set[CodeType]) -> None:
    """Add (module, name) of each global a test function or fixture uses, and of what
    the functions it uses from tests/ use in turn."""
    func = inspect.unwrap(obj) if callable(obj) else None
    if not isinstance(func, FunctionType) or func.__code__ in seen:
        return
    if TESTS_DIR not in Path(func.__code__.co_filename).resolve().parents:
        return
    seen.add(func.__code__)
    names = _global_names(func.__code__)
    # `from M import N` inside the function: both M and N are among the code's names
    out.update(t for t in MODEL_CALLS | SUBPROCESS_CALLS if t[0] in names and t[1] in names)
    for name in names:
        used = func.__globals__.get(name)
        if used is None:
            continue
        out.add((getattr(used, "__module__", None), getattr(used, "__name__", None)))
        _calls(used, out, seen)


def _global_names(code: CodeType) -> set[str]:
    """Names a function's code (and the functions nested in it) looks up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _global_names(const)
    return names


def guard_fast_tier(config: pytest.Config) -> None:
    """Under --fast, make every model load, and every start of Python (the CLI, a server)
    or tmux, fail the running test, naming the mark it lacks. Process-wide for the rest of
    the run (module fixtures are set up before function ones): it selected only unmarked
    tests. Small tools (uname, a compiler) may still run."""
    if not config.getoption("fast"):
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
