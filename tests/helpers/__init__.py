"""Test helpers: the CLI in a subprocess, small model files built on the fly, a real server."""
