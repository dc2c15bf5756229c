"""The UI and CLI see only the engine interface (importing them must not pull in an
engine's heavy dependencies), and the module map in docs/architecture.md names every module."""

import subprocess
import sys


def test_ui_and_cli_do_not_import_torch_or_llama_cpp():
    code = ("import sys, localchat.cli, localchat.tui.app, localchat.cli.run; "
            "print(sorted(m for m in ('torch', 'llama_cpp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
