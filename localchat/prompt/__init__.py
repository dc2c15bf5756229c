"""Prompt rendering, below the engine: chat templates in a sandbox (template.py, sandbox.py)
and the built-in formats for files without one (builtin_templates.py)."""
