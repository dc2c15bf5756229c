"""The UI and CLI see only the engine interface (importing them must not pull in an
engine's heavy dependencies), and the README's map of the code names every module."""

import subprocess
import sys


def test_ui_and_cli_do_not_import_torch_or_llama_cpp():
    code = ("import sys, localchat.cli, localchat.tui.app, localchat.cli.run; "
            "print(sorted(m for m in ('torch', 'llama_cpp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_readme_tree_names_every_module():
    """README's "How it is built" is the map a newcomer reads: no module may be missing."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    start = readme.index("## How it is built")
    tree = readme[start:readme.index("```", readme.index("```", start) + 3)]
    modules = [p for package in ("localchat", "quantize") for p in (root / package).rglob("*.py")
               if p.name != "__init__.py"]
    assert modules and [str(p.relative_to(root)) for p in modules if p.stem not in tree] == []
