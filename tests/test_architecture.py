"""The UI and CLI see only the engine interface (importing them must not pull in an
engine's heavy dependencies), and the module map in docs/architecture.md names every module."""

import pytest
import subprocess
import sys


def python_lines(code: str) -> list[str]:
    """What `python -c code` printed, a line each (its stderr in the failure if it fails)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.subprocess
def test_ui_and_cli_do_not_import_torch_or_llama_cpp():
    assert python_lines("import sys, localchat.cli, localchat.tui.app, localchat.cli.run; "
                        "print(sorted(m for m in ('torch', 'llama_cpp') if m in sys.modules))"
                        ) == ["[]"]


@pytest.mark.subprocess
def test_commands_that_load_no_model_import_no_engine():
    """`--help` (every subcommand's parser built), `run --help` and `models` run without
    torch or llama_cpp (~1.3 s of imports a process): only a loaded engine needs them."""
    assert python_lines(
        "import contextlib, io, sys\n"
        "from localchat.cli import main\n"
        "for argv in (['--help'], ['run', '--help'], ['models']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            assert main(argv) == 0, argv\n"
        "        except SystemExit as exc:\n"
        "            assert exc.code == 0, argv\n"
        "print(sorted(m for m in ('torch', 'llama_cpp') if m in sys.modules))") == ["[]"]


@pytest.mark.subprocess
def test_a_one_shot_reply_on_llama_cpp_loads_neither_torch_nor_llama_cpps_high_level_half():
    """`run PROMPT -n 1` on llama.cpp needs only llama.cpp's bindings: torch (~1.4 s) and
    llama_cpp's Llama class with its chat formats (~55 ms) stay unimported, and the package
    still completes itself for code that asks it for Llama afterwards."""
    assert python_lines(
        "import contextlib, io, sys\n"
        "from localchat.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert main(['run', 'Hi', '-n', '1', '--engine', 'llama.cpp']) == 0\n"
        "assert out.getvalue().strip(), 'no reply'\n"
        "print(sorted(m for m in ('torch', 'llama_cpp.llama', 'llama_cpp.llama_chat_format')\n"
        "             if m in sys.modules))\n"
        "import llama_cpp\n"
        "from llama_cpp.llama import Llama\n"
        "print(llama_cpp.Llama is Llama, bool(llama_cpp.__version__))")[:2] == ["[]", "True True"]


def test_the_architecture_map_names_every_module():
    """docs/architecture.md's "Module map" is the map a newcomer reads: no module may be missing."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = doc.index("## Module map")
    tree = doc[start:doc.index("```", doc.index("```", start) + 3)]
    modules = [p for package in ("localchat", "quantize") for p in (root / package).rglob("*.py")
               if p.name != "__init__.py"]
    assert modules and [str(p.relative_to(root)) for p in modules if p.stem not in tree] == []
