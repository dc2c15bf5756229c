"""EngineConfig validates itself in setting names; choose() decides the executor, context,
threads and draft before anything loads; the CLI says a setting's error with its flag."""

from __future__ import annotations

import os

import pytest

from helpers.cli import assert_one_line_error, localchat
from localchat.engine.choice import capped_threads, choose
from localchat.engine.config import NO_DRAFT, DraftChoice, EngineConfig
from localchat.errors import ConfigError

CPUS = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("settings, setting", [
    (dict(ctx_size=-1), "ctx_size"), (dict(threads=0), "threads"),
    (dict(parallel=300), "parallel"),
    (dict(engine="vulkan"), "engine"), (dict(cache_type_k="q4_0"), "cache_type_k"),
    (dict(gpu_layers=-2), "gpu_layers"), (dict(timeout=5.0), "timeout"),
    (dict(endpoint="http://127.0.0.1:9/v1", chat_template="chatml"), "chat_template"),
])
def test_a_bad_setting_is_refused_naming_the_setting_not_a_flag(settings, setting):
    with pytest.raises(ConfigError) as caught:
        EngineConfig(**settings)
    assert caught.value.setting == setting and str(caught.value).startswith(setting)
    assert "--" not in str(caught.value)


@pytest.mark.parametrize("kind, tokens", [("none", 3), ("ngram", 99), ("ngram", 0)])
def test_a_fixed_gamma_needs_a_draft_and_a_range(kind, tokens):
    with pytest.raises(ConfigError) as caught:
        DraftChoice(kind, tokens=tokens)
    assert caught.value.setting == "num_draft_tokens"


def test_a_draft_is_a_typed_choice_that_round_trips_through_its_record():
    for record in (None, "auto", "ngram", "/models/draft.gguf", "owner/repo:Q4_0"):
        assert DraftChoice.parse(DraftChoice.parse(record).record()) == DraftChoice.parse(record)
    assert EngineConfig(draft="ngram").draft == DraftChoice("ngram")
    assert EngineConfig().draft == NO_DRAFT and not NO_DRAFT.enabled
    assert DraftChoice.parse("/models/draft.gguf").label() == "draft.gguf"
    with pytest.raises(ConfigError):
        DraftChoice("model")  # a model draft needs its SPEC


def test_the_engine_asked_for_is_kept_and_a_directory_is_torchs(hf_dir, monkeypatch):
    plan = choose(EngineConfig("default"))  # both run it: $LOCALCHAT_ENGINE's (conftest)
    assert (plan.engine, plan.why) == ("llama.cpp", "$LOCALCHAT_ENGINE")
    plan = choose(EngineConfig("default", engine="torch"))
    assert (plan.engine, plan.why) == ("torch", "as asked")
    plan = choose(EngineConfig(str(hf_dir)))  # only torch runs a directory
    assert (plan.engine, plan.why) == ("torch", "it runs Hugging Face directories")
    monkeypatch.setenv("LOCALCHAT_ENGINE", "llama")
    with pytest.raises(ConfigError, match=r"\$LOCALCHAT_ENGINE must be llama.cpp, torch or auto"):
        choose(EngineConfig("default"))
    with pytest.raises(ConfigError) as caught:
        choose(EngineConfig(str(hf_dir), engine="llama.cpp"))
    assert caught.value.setting == "engine" and "torch" in str(caught.value)


def test_choose_resolves_context_threads_and_draft_before_loading():
    plan = choose(EngineConfig("default", ctx_size=0, threads=CPUS + 100, draft="auto"))
    assert plan.ctx_size == plan.facts.context_length == 8192
    assert plan.threads == CPUS and "capped" in plan.notes[0]
    assert plan.draft.facts is None and plan.draft.auto  # no kept draft: prompt lookup
    assert choose(EngineConfig("default")).ctx_size == 4096 and choose(EngineConfig()).draft is None
    with pytest.raises(ConfigError) as caught:
        choose(EngineConfig("default", ctx_size=9000))
    assert caught.value.setting == "ctx_size" and "8192" in caught.value.problem


def test_threads_are_capped_at_the_cpus_this_process_may_use():
    assert capped_threads(None) == (None, ())
    assert capped_threads(1) == (1, ())
    threads, notes = capped_threads(5000)
    assert threads == CPUS and notes == (f"threads capped at {CPUS}, the CPUs this process may "
                                         "use (asked for 5000)",)


@pytest.mark.subprocess
def test_the_cli_says_a_settings_error_with_its_flag_and_notes_a_thread_cap():
    proc = localchat("run", "-c", "9000", "hi")
    assert_one_line_error(proc, "-c/--ctx-size", "8192")
    proc = localchat("run", "--no-draft", "-t", "5000", "-n", "2", "--temp", "0", "--verbose",
                     "--no-history", "Say hi.")
    assert proc.returncode == 0, proc.stderr
    assert f"localchat: note: threads capped at {CPUS}" in proc.stderr
    assert "localchat: engine llama.cpp ($LOCALCHAT_ENGINE)" in proc.stderr
    assert "localchat: compute: llama.cpp CPU " in proc.stderr  # its variant and features


def test_the_plan_is_complete_every_default_resolved_once():
    """load_engine(plan) needs nothing else: each executor's spec holds every setting."""
    from localchat.engine.choice import (DEFAULT_PARALLEL, LlamaCppSpec, RemoteSpec, TorchSpec,
                                         default_threads)
    from localchat.storage.kv_snapshots import DEFAULT_BUDGET

    plan = choose(EngineConfig("default"))
    assert plan.spec == LlamaCppSpec(4096, default_threads(), DEFAULT_PARALLEL)
    assert plan.adapt_threads and plan.kv_disk == DEFAULT_BUDGET
    given = choose(EngineConfig("default", threads=1, parallel=2, device="cpu", kv_disk=0,
                                exact_batching=True, flash_attn=False,
                                draft=DraftChoice("ngram", tokens=3)))
    assert given.spec == LlamaCppSpec(4096, 1, 2, 0, (None, None), True, False)
    assert not given.adapt_threads and given.kv_disk == 0 and given.draft.tokens == 3
    torch_plan = choose(EngineConfig("default", engine="torch", kv_memory=2**30))
    assert torch_plan.spec == TorchSpec(4096, default_threads(), 2**30)
    remote = choose(EngineConfig("default", endpoint="http://127.0.0.1:9/v1", timeout=5))
    assert remote.spec == RemoteSpec("http://127.0.0.1:9/v1", None, None, None, 5)
