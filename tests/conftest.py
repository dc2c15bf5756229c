"""Shared fixtures. Tests run on the real bundled model through real llama.cpp, never
touch the network (offline hub mode) and never write to the user's data directory."""

from __future__ import annotations

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "localchat-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def engine():
    """The bundled SmolLM2-135M Q4_1 in the llama.cpp engine, 1024-token context."""
    from localchat.engine import load_engine

    eng = load_engine("default", ctx_size=1024, threads=2)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def small_engine():
    """The same model with a 256-token context (llama.cpp rounds contexts up to multiples of 256), for overflow and length tests."""
    from localchat.engine import load_engine

    eng = load_engine("default", ctx_size=256, threads=2)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def torch_engine():
    """The bundled model in localchat's own torch engine, 1024-token context, and a KV
    pool of two contexts (2048 tokens of 23040 bytes)."""
    from localchat.engine import load_engine

    eng = load_engine("default", engine="torch", ctx_size=1024, threads=2,
                      kv_memory=2048 * 23040)
    yield eng
    eng.close()
