"""The UI and CLI see only the engine interface: importing them must not pull in an
engine's heavy dependencies (those load lazily, in load_engine)."""

import subprocess
import sys


def test_ui_and_cli_do_not_import_torch_or_llama_cpp():
    code = ("import sys, localchat.cli, localchat.tui.app, localchat.cli.run; "
            "print(sorted(m for m in ('torch', 'llama_cpp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
