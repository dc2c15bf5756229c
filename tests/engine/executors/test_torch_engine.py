"""The torch engine behind the engine interface, on the real bundled model."""

from __future__ import annotations

import json
import threading

import pytest

from localchat.engine.base import Delta, Message, Request, Result, SamplingParams
from localchat.errors import ContextOverflowError

from helpers.cli import localchat

GREEDY = SamplingParams(temperature=0.0)
HELLO = [Message("user", "Hello! Who are you?")]


def test_tokenization_equals_llama_cpps(torch_engine, engine):
    texts = ["Hello, world!", "naïve café 東京 ✓ 🙂", "  leading spaces\tand\ttabs\n\n",
             "<|im_start|>system looks special but is typed", "def f(x):\n    return x**2"]
    for text in texts:
        assert torch_engine.tokenize_text(text) == engine.tokenize_text(text)
    msgs = [Message("system", "Be brief."), Message("user", texts[3])]
    assert torch_engine.tokenize_messages(msgs) == engine.tokenize_messages(msgs)


def test_streams_a_reply_with_measured_stats(torch_engine):
    events = list(torch_engine.generate(Request(messages=HELLO, sampling=GREEDY, max_tokens=24)))
    result = events[-1]
    assert isinstance(result, Result) and result.text.strip()
    assert result.text == "".join(e.text for e in events[:-1] if isinstance(e, Delta))
    s = result.stats
    assert s.ttft_s > 0 and s.prefill_tok_s > 0 and s.decode_tok_s > 0
    assert s.kv_cache_capacity_bytes == 2 * 1024 * 23040  # the pool: 2 contexts of 16-token blocks
    streaming = max(e.stats.kv_cache_bytes for e in events[:-1])  # blocks in use mid-reply
    assert streaming > 0 and streaming % (16 * 23040) == 0
    # tokens whose KV is in the cache: the last sampled token is never fed back
    in_cache = s.prompt_tokens + s.completion_tokens - (result.finish_reason == "length")
    assert s.context_tokens == in_cache
    # finished: its blocks are back in the pool at once, the full ones cached for the
    # conversation, which still holds them (the gauge does not drop to 0 after a reply)
    assert s.kv_cache_bytes == s.context_tokens // 16 * 16 * 23040 > 0
    assert torch_engine.memory()["kv_cache_bytes"] == 0  # between requests: none in use


def test_greedy_is_deterministic_and_seeded_sampling_repeats(torch_engine):
    a = torch_engine.complete(Request(messages=HELLO, sampling=GREEDY, max_tokens=12))
    b = torch_engine.complete(Request(messages=HELLO, sampling=GREEDY, max_tokens=12))
    assert a.text == b.text
    hot = SamplingParams(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, seed=7,
                         repeat_penalty=1.1)
    c = torch_engine.complete(Request(messages=HELLO, sampling=hot, max_tokens=16))
    d = torch_engine.complete(Request(messages=HELLO, sampling=hot, max_tokens=16))
    assert c.text == d.text


def test_second_turn_reuses_cached_prefix_blocks(torch_engine):
    system = [Message("system", "You are a concise assistant. " * 4)]
    first = torch_engine.complete(Request(messages=system + HELLO, sampling=GREEDY, max_tokens=8))
    assert torch_engine.blocks.usage().cached * 16 >= first.stats.prompt_tokens // 16 * 16
    turn2 = system + HELLO + [Message("assistant", first.text), Message("user", "And then?")]
    second = torch_engine.complete(Request(messages=turn2, sampling=GREEDY, max_tokens=8))
    full_blocks = first.stats.prompt_tokens // 16 * 16
    assert second.stats.cached_tokens >= full_blocks > 0
    # a new chat with the same system prompt shares its blocks too
    other = torch_engine.complete(Request(messages=system + [Message("user", "Hi")],
                                          sampling=GREEDY, max_tokens=4))
    assert other.stats.cached_tokens >= 16


def test_exact_repeat_of_a_prompt_recomputes_only_its_last_block(torch_engine):
    req = Request(messages=HELLO, sampling=GREEDY, max_tokens=4)
    torch_engine.complete(req)
    again = torch_engine.complete(req)
    n = again.stats.prompt_tokens
    assert again.stats.cached_tokens == (n - 16 if n % 16 == 0 else n // 16 * 16)


def test_cancel_and_length_and_overflow(torch_engine):
    cancel = threading.Event()
    result = None
    for i, event in enumerate(torch_engine.generate(
            Request(messages=[Message("user", "Write a long story.")], sampling=GREEDY,
                    max_tokens=100), cancel)):
        if i == 2:
            cancel.set()
        result = event
    assert result.finish_reason == "cancelled" and result.stats.completion_tokens == 3
    r = torch_engine.complete(Request(messages=HELLO, sampling=GREEDY, max_tokens=3))
    assert r.finish_reason == "length" and r.stats.completion_tokens == 3
    with pytest.raises(ContextOverflowError, match="1024 tokens"):
        torch_engine.complete(Request(messages=[Message("user", "word " * 1200)]))


# slow: `run --engine torch --json` on the bundled GGUF is also test_speculative_engine.py's
# test_json_result_carries_draft_stats, on an HF directory test_hf_models.py's
@pytest.mark.subprocess
@pytest.mark.slow
def test_run_command_with_the_torch_engine():
    proc = localchat("run", "Hello! Who are you?", "--engine", "torch", "-n", "8", "--temp", "0",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["engine"] == "torch" and out["text"] and out["decode_tok_s"] > 0
    assert proc.stderr == ""  # llama.cpp's vocab loader logs nothing on the terminal


@pytest.mark.model  # loads engines
def test_kv_memory_budget():
    from localchat.cli.flags import flag_error
    from localchat.engine import EngineConfig, open_engine
    from localchat.errors import UsageError

    with pytest.raises(UsageError, match="less than the 1024-token context") as caught:
        open_engine(EngineConfig("default", engine="torch", ctx_size=1024, kv_memory=1000 * 23040))
    assert str(flag_error(caught.value)).startswith("--kv-memory ")  # as `run` says it
    auto = open_engine(EngineConfig("default", engine="torch", ctx_size=256, kv_memory=512 * 23040))
    try:
        assert auto.blocks.usage().total == 512 // 16
    finally:
        auto.close()


# slow: the refusal and the flag it names are checked in-process above; the CLI's one-line
# settings errors in test_config.py
@pytest.mark.subprocess
@pytest.mark.slow
def test_kv_memory_flag_errors_are_one_line():
    proc = localchat("run", "hi", "--engine", "torch", "--kv-memory", "1MB")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--kv-memory" in proc.stderr


def test_known_torch_warnings_are_hidden_and_others_still_show(torch_engine):
    """Loading the torch engine hides torch's LeafSpec deprecation and its inductor codegen
    note (their real texts, from torch itself); any other warning still reaches the user."""
    import inspect
    import warnings

    import torch._inductor.codegen.cpp as inductor_cpp
    from torch.utils._pytree import LeafSpec

    from localchat.engine.executors.torch.executor import quiet_library_warnings

    note = "bf16 and fp16 are mixed in the scheduler node."
    assert f'warnings.warn("{note}")' in inspect.getsource(inductor_cpp)  # torch's own text
    # pytest restores the warning filters after each test, so those the session's engine
    # set at load are gone by now: set them again, as every load does
    quiet_library_warnings()
    with warnings.catch_warnings(record=True) as seen:
        LeafSpec()  # torch warns on its own here
        warnings.warn(note, UserWarning)
        warnings.warn("localchat: a warning of ours", UserWarning)
    assert [str(w.message) for w in seen] == ["localchat: a warning of ours"]
