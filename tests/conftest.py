"""Shared fixtures. Tests run on the real bundled model through real llama.cpp, never
touch the network (offline hub mode) and never write to the user's data directory."""

from __future__ import annotations

import os
import signal

import pytest

from helpers import cpus, tiers

# A run started in the background (`cmd &` in a script, nohup) inherits SIGINT ignored, and so
# would every process the tests start: the tests that press Ctrl+C on one need it back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ["HF_HUB_OFFLINE"] = "1"
# On pytest-xdist's workers (`make test`) two processes share the cores, each with OpenMP
# threads (llama.cpp's, torch's) that spin at every barrier while the peer they wait for is
# preempted: 3 engine test files took 398 s on two workers, 74 s in one process, and 63 s on two
# workers with no spinning (docs/testing.md). Set before either library loads; inherited by the
# processes the tests start.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("GOMP_SPINCOUNT", "0")
# The torch executor's layer pieces run eagerly here: compiling every tiny test model's shapes
# would double the run. test_runtime.py and test_layer_steps.py run them compiled.
os.environ.setdefault("LOCALCHAT_EAGER", "1")
# The default engine is measured per machine (engine/engine_rule.py): the tests name theirs,
# as a script would, so that what they check does not depend on the CPU they run on.
# tests/engine/test_engine_rule.py removes this and measures.
os.environ.setdefault("LOCALCHAT_ENGINE", "llama.cpp")


# Each xdist worker computes on its share of the CPUs (tests/helpers/cpus.py): the engines'
# default threads follow, as they would in a cpuset.
cpus.run_on(cpus.worker_share())


def pytest_addoption(parser):
    tiers.add_option(parser)


@pytest.hookimpl(tryfirst=True)  # marks first, so that -m sees them
def pytest_collection_modifyitems(config, items):
    tiers.mark_and_select(config, items)


def pytest_sessionstart(session):
    tiers.guard_fast_tier(session.config)


@pytest.fixture
def all_cpus():
    """The test runs on every CPU (tests about threads, or timing a multi-threaded step), its
    worker back on its share afterwards."""
    cpus.run_on(cpus.ALL)
    yield
    cpus.run_on(cpus.worker_share())


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "localchat-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _loaded(**options):
    """A session-long engine on the bundled SmolLM2-135M Q4_1, closed at the end."""
    from localchat.engine import EngineConfig, open_engine

    eng = open_engine(EngineConfig("default", threads=2, **options))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def engine():
    """The llama.cpp engine, 1024-token context."""
    yield from _loaded(ctx_size=1024)


@pytest.fixture(scope="session")
def exact_engine():
    """llama.cpp with exact batching (1024-token context): a reply computes the same bits
    whatever shares its step, is drafted or was cached, so tests that compare replies across
    a feature use it (the default f16 KV may differ in a token: docs/architecture.md)."""
    yield from _loaded(ctx_size=1024, exact_batching=True)


@pytest.fixture(scope="session")
def small_engine():
    """llama.cpp with a 256-token context (it rounds contexts up to multiples of 256),
    for overflow and length tests."""
    yield from _loaded(ctx_size=256)


@pytest.fixture(scope="session")
def torch_engine():
    """localchat's own torch engine, 1024-token context, and a KV pool of two contexts
    (2048 tokens of 23040 bytes)."""
    yield from _loaded(engine="torch", ctx_size=1024, kv_memory=2048 * 23040)


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """The bundled GGUF exported to a Hugging Face directory (float32 safetensors, a
    tokenizer.json rebuilt from the GGUF vocabulary): HF-path tests without downloads."""
    from localchat.models.specs import resolve_model
    from quantize.export_hf import export_gguf_to_hf

    return export_gguf_to_hf(resolve_model("default"), tmp_path_factory.mktemp("hf") / "smollm2")
