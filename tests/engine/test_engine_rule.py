"""The default-engine rule (engine/engine_rule.py) and its figures (engine_figures.py): the
only executor that runs a file, else $LOCALCHAT_ENGINE's, else the one measured faster here
for the use (measured once, kept, never trusted when damaged); serve's llama.cpp slots."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import gguf
import pytest

from localchat.engine import choose, engine_figures, engine_probe, engine_rule
from localchat.engine.config import EngineConfig
from localchat.engine.engine_figures import Figures
from localchat.engine.engine_rule import SERVE_SLOTS, faster
from localchat.engine.choice import default_threads
from localchat.models.planner import engine_kv_bytes_per_token
from localchat.models.specs import resolve_model_facts
from localchat.server.run import serving_plan
from helpers.cli import localchat
from helpers.tiny_files import write_tiny_gguf

FT = gguf.LlamaFileType
PLENTY = 1 << 40
# kept figures for the decision tests: torch batches faster, llama.cpp starts faster
LLAMA = Figures(start_s=0.5, prefill_tok_s=400.0, decode_tok_s=100.0, many_tok_s=150.0)
TORCH = Figures(start_s=4.0, prefill_tok_s=500.0, decode_tok_s=110.0, many_tok_s=450.0)


@pytest.fixture
def measured_rule(monkeypatch):
    """No $LOCALCHAT_ENGINE (the rule decides), an AVX2 CPU and plenty of memory."""
    monkeypatch.delenv("LOCALCHAT_ENGINE")
    monkeypatch.setattr(engine_rule, "has_avx2", lambda: True)
    monkeypatch.setattr("localchat.units.available_memory", lambda: PLENTY)


def _file(tmp_path, arch="llama", file_type=FT.MOSTLY_Q4_1):
    return str(write_tiny_gguf(tmp_path / f"{arch}-{file_type.name}.gguf", arch=arch,
                               file_type=file_type))


def test_the_only_executor_that_runs_a_file_is_chosen_without_measuring(tmp_path, measured_rule,
                                                                         monkeypatch, capsys):
    def plan(model, **settings):
        return choose(EngineConfig(model=model, **settings))

    gemma = plan(_file(tmp_path, arch="gemma"))
    assert (gemma.engine, gemma.why) == ("llama.cpp", "the torch executor does not run gemma models")
    iq = plan(_file(tmp_path, file_type=FT.MOSTLY_IQ4_XS))
    assert iq.why == "the torch executor has no kernel of its own for IQ4_XS"
    llama = _file(tmp_path)
    asked = plan(llama, cache_type_k="f16")
    assert (asked.engine, asked.why) == ("llama.cpp",
                                         "llama.cpp's own settings are given (cache_type_k)")
    monkeypatch.setattr(engine_rule, "has_avx2", lambda: False)
    assert "need an x86-64 CPU with AVX2" in plan(llama).why
    assert capsys.readouterr().err == "" and not engine_figures.figures_path().exists()


def test_where_both_run_a_file_the_kept_figures_decide_by_use(tmp_path, measured_rule, capsys):
    model = _file(tmp_path, file_type=FT.MOSTLY_Q4_0)
    engine_figures.keep(resolve_model_facts(model), default_threads(),
                        {"llama.cpp": LLAMA, "torch": TORCH})
    plans = {use: choose(EngineConfig(model=model, use=use)) for use in ("one-shot", "chat", "many")}
    assert capsys.readouterr().err == ""  # kept: nothing measured again
    # one-shot: 0.5 + 128/400 + 128/100 = 2.10 s against 4 + 128/500 + 128/110 = 5.42 s
    assert (plans["one-shot"].engine, plans["one-shot"].why) == (
        "llama.cpp", "measured here for a one-shot reply, start included: llama.cpp 2.10 s, "
                     "torch 5.42 s")
    # a chat reply: 1.60 + 0.05 s against 1.42 + 0.40 s: llama.cpp's start decides
    assert (plans["chat"].engine, plans["chat"].why) == (
        "llama.cpp", "measured here for a chat reply, 1/10 of the start included: llama.cpp "
                     "1.65 s, torch 1.82 s")
    quick = Figures(start_s=0.6, prefill_tok_s=500.0, decode_tok_s=110.0, many_tok_s=450.0)
    assert faster(LLAMA, quick, "chat")[0] == "torch"  # 1.65 s against 1.48 s
    assert (plans["many"].engine, plans["many"].why) == (
        "torch", "measured here for many streams at once: torch 450 tok/s, llama.cpp 150 tok/s")
    os.environ["LOCALCHAT_ENGINE"] = "llama.cpp"  # a preference where both run it
    try:
        assert choose(EngineConfig(model=model, use="many")).why == "$LOCALCHAT_ENGINE"
    finally:
        del os.environ["LOCALCHAT_ENGINE"]


def test_a_tie_and_a_failed_executor_go_to_the_other():
    almost = Figures(0.5, 400.0, 100.0, 150.0 * 1.04)
    assert faster(LLAMA, almost, "many")[0] == "llama.cpp"  # within the 5 % margin
    broken = Figures(failed="unknown model architecture")
    assert faster(LLAMA, broken, "many") == (
        "llama.cpp", "torch failed to load it here (unknown model architecture)")
    assert faster(broken, TORCH, "chat")[0] == "torch"
    assert faster(broken, broken, "chat")[0] == "llama.cpp"


@pytest.mark.parametrize("damage", ["garbage", "wrong types", "symlink", "fifo", "huge"])
def test_damaged_figures_are_never_trusted_and_a_link_is_never_followed(tmp_path, damage):
    facts = resolve_model_facts(_file(tmp_path))
    engine_figures.keep(facts, 2, {"llama.cpp": LLAMA, "torch": TORCH})
    assert engine_figures.cached(facts, 2, ("llama.cpp", "torch")) == {
        "llama.cpp": LLAMA, "torch": TORCH}
    path = engine_figures.figures_path()
    key = engine_figures.figures_key(facts, 2)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(path.read_text())
    path.unlink()
    if damage == "garbage":
        path.write_bytes(b"\x00{not json")
    elif damage == "wrong types":
        path.write_text('{"%s": {"llama.cpp": {"start_s": "fast"}, "torch": []}}' % key)
    elif damage == "symlink":
        path.symlink_to(elsewhere)
    elif damage == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(b" " * (engine_figures.MAX_FILE_BYTES + 1))
    assert engine_figures.cached(facts, 2, ("llama.cpp", "torch")) is None
    engine_figures.keep(facts, 2, {"llama.cpp": LLAMA, "torch": TORCH})
    if damage in ("symlink", "fifo"):  # not ours to replace, nor to write through
        assert path.is_symlink() or not path.is_file()
        assert elsewhere.read_text().startswith("{")
    else:  # replaced by good figures
        assert engine_figures.cached(facts, 2, ("llama.cpp", "torch"))["torch"] == TORCH


def test_figures_hold_for_one_file_version_and_thread_count(tmp_path):
    facts = resolve_model_facts(_file(tmp_path))
    engine_figures.keep(facts, 2, {"llama.cpp": LLAMA, "torch": TORCH})
    assert engine_figures.cached(facts, 1, ("llama.cpp", "torch")) is None  # other threads
    stat = facts.path.stat()
    os.utime(facts.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten
    assert engine_figures.cached(facts, 2, ("llama.cpp", "torch")) is None


def test_serve_takes_enough_llama_cpp_slots_for_its_queue(tmp_path, measured_rule):
    gemma = EngineConfig(model=_file(tmp_path, arch="gemma"))
    plan, why = serving_plan(gemma, 64)
    assert (plan.engine, plan.spec.parallel) == ("llama.cpp", SERVE_SLOTS)
    assert why == f"the torch executor does not run gemma models; {SERVE_SLOTS} KV slots"
    assert serving_plan(gemma, 3)[0].spec.parallel == 3  # no more than the queue admits
    asked, why = serving_plan(EngineConfig(model=gemma.model, engine="llama.cpp", parallel=2), 64)
    assert (asked.spec.parallel, why) == (2, "as asked")


def test_default_slots_stay_within_half_the_free_memory(tmp_path, measured_rule, monkeypatch):
    model = _file(tmp_path, arch="gemma")
    facts = resolve_model_facts(model)
    slot = engine_kv_bytes_per_token(facts, "llama.cpp") * 256  # its 256-token context
    monkeypatch.setattr("localchat.units.available_memory", lambda: 2 * 5 * slot + slot // 2)
    assert serving_plan(EngineConfig(model=model), 64)[0].spec.parallel == 5
    monkeypatch.setattr("localchat.units.available_memory", lambda: 1)
    assert serving_plan(EngineConfig(model=model), 64)[0].spec.parallel == 1


@pytest.mark.subprocess
@pytest.mark.model
def test_the_bundled_model_is_measured_once_and_the_faster_chosen(monkeypatch, capsys, all_cpus):
    """A real probe of both executors on the bundled model (shorter replies than a user's
    probe: the flow is under test, not the figures): the figures kept, the choice the one
    they say is faster for each use, and later choices made without measuring."""
    monkeypatch.delenv("LOCALCHAT_ENGINE")
    monkeypatch.setattr(engine_probe, "ONE_STREAM_TOKENS", 8)
    monkeypatch.setattr(engine_probe, "MANY_STREAM_TOKENS", 4)
    chat = choose(EngineConfig("default", threads=2))
    err = capsys.readouterr().err
    assert err.startswith("localchat: measuring llama.cpp and torch on SmolLM2-135M-Instruct "
                          "to choose the faster (once for this file and CPU; kept in ")
    kept = engine_figures.cached(chat.facts, 2, ("llama.cpp", "torch"))
    for figures in kept.values():
        assert not figures.failed and min(figures.start_s, figures.prefill_tok_s,
                                           figures.decode_tok_s, figures.many_tok_s) > 0
    for use in ("one-shot", "chat", "many"):
        plan = choose(EngineConfig("default", threads=2, use=use))
        assert (plan.engine, plan.why) == faster(kept["llama.cpp"], kept["torch"], use)
    assert capsys.readouterr().err == ""


def test_bench_engines_measures_afresh_keeps_and_says_the_choice_per_use(monkeypatch):
    """`bench --task engines` (its measuring stood in for: the probe is tested above) keeps
    what it measured and prints what the rule then chooses for each use."""
    measured = {"llama.cpp": LLAMA, "torch": TORCH}
    calls = []

    def measure(facts, engine, threads):
        calls.append((facts.name, engine, threads))
        return measured[engine]

    monkeypatch.setattr(engine_probe, "measure", measure)
    bench = localchat("bench", "--task", "engines", "-t", "2", "--json")
    assert bench.returncode == 0, bench.stderr
    report = json.loads(bench.stdout)
    assert calls == [("SmolLM2-135M-Instruct", "llama.cpp", 2), ("SmolLM2-135M-Instruct", "torch", 2)]
    facts = resolve_model_facts("default")
    assert engine_figures.cached(facts, 2, ("llama.cpp", "torch")) == measured
    assert report["figures"] == {name: asdict(f) for name, f in measured.items()}
    assert {use: tuple(c) for use, c in report["choice"].items()} == {
        use: faster(LLAMA, TORCH, use) for use in ("one-shot", "chat", "many")}


def test_the_figures_key_reads_llama_cpps_version_as_importlib_metadata_does():
    """installed_version() (a dist-info name on sys.path) agrees with importlib.metadata,
    whose import the one-shot start no longer pays; an absent one is "none"."""
    from importlib.metadata import version

    assert engine_figures.installed_version("llama_cpp_python") == version("llama-cpp-python")
    assert engine_figures.installed_version("torch") == version("torch")
    assert engine_figures.installed_version("no_such_distribution_here") == "none"
