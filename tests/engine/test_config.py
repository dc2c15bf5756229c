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
    (dict(parallel=300), "parallel"), (dict(num_draft_tokens=3), "num_draft_tokens"),
    (dict(draft="ngram", num_draft_tokens=99), "num_draft_tokens"),
    (dict(engine="vulkan"), "engine"), (dict(cache_type_k="q4_0"), "cache_type_k"),
    (dict(gpu_layers=-2), "gpu_layers"), (dict(timeout=5.0), "timeout"),
    (dict(endpoint="http://127.0.0.1:9/v1", chat_template="chatml"), "chat_template"),
])
def test_a_bad_setting_is_refused_naming_the_setting_not_a_flag(settings, setting):
    with pytest.raises(ConfigError) as caught:
        EngineConfig(**settings)
    assert caught.value.setting == setting and str(caught.value).startswith(setting)
    assert "--" not in str(caught.value)


def test_a_draft_is_a_typed_choice_that_round_trips_through_its_record():
    for record in (None, "auto", "ngram", "/models/draft.gguf", "owner/repo:Q4_0"):
        assert DraftChoice.parse(DraftChoice.parse(record).record()) == DraftChoice.parse(record)
    assert EngineConfig(draft="ngram").draft == DraftChoice("ngram")
    assert EngineConfig().draft == NO_DRAFT and not NO_DRAFT.enabled
    assert DraftChoice.parse("/models/draft.gguf").label() == "draft.gguf"
    with pytest.raises(ConfigError):
        DraftChoice("model")  # a model draft needs its SPEC


def test_the_engine_comes_from_the_file_unless_one_is_asked_for(hf_dir):
    assert choose(EngineConfig("default")).engine == "llama.cpp"  # a GGUF
    assert choose(EngineConfig(str(hf_dir))).engine == "torch"  # a Hugging Face directory
    assert choose(EngineConfig("default", engine="torch")).engine == "torch"
    assert choose(EngineConfig("default", engine="auto")).engine == "torch"  # a Llama
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


def test_the_cli_says_a_settings_error_with_its_flag_and_notes_a_thread_cap():
    proc = localchat("run", "-c", "9000", "hi")
    assert_one_line_error(proc, "-c/--ctx-size", "8192")
    proc = localchat("run", "--no-draft", "-t", "5000", "-n", "2", "--temp", "0", "--verbose",
                     "--no-history", "Say hi.")
    assert proc.returncode == 0, proc.stderr
    assert f"localchat: note: threads capped at {CPUS}" in proc.stderr
    assert "localchat: engine llama.cpp (chosen for the file)" in proc.stderr
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
                                exact_batching=True, flash_attn=False, num_draft_tokens=3,
                                draft="ngram"))
    assert given.spec == LlamaCppSpec(4096, 1, 2, 0, (None, None), True, False)
    assert not given.adapt_threads and given.kv_disk == 0 and given.num_draft_tokens == 3
    torch_plan = choose(EngineConfig("default", engine="torch", kv_memory=2**30))
    assert torch_plan.spec == TorchSpec(4096, default_threads(), 2**30)
    remote = choose(EngineConfig("default", endpoint="http://127.0.0.1:9/v1", timeout=5))
    assert remote.spec == RemoteSpec("http://127.0.0.1:9/v1", None, None, None, 5)
