"""The runtime on both executors, on the real bundled model: greedy output identical
alone, batched with 15 others and with a draft; seeded sampling the same batched as
alone; speculative sampling distributed as plain sampling (χ²); prefix hits on llama.cpp
KV slots; more requests than slots wait their turn."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from localchat.engine.config import DraftChoice
from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import Message, Request, SamplingParams

pytestmark = pytest.mark.model  # loads the bundled model

GREEDY = SamplingParams(temperature=0.0)
TOPICS = ["the sea", "volcanoes", "bread", "the moon", "bees", "chess", "rain", "glass",
          "trains", "owls", "paper", "salt", "bridges", "clocks", "maps", "copper"]
N_TOKENS = 20


def _request(i: int, sampling: SamplingParams = GREEDY, n: int = N_TOKENS) -> Request:
    return Request(messages=[Message("user", f"Write three sentences about {TOPICS[i]}.")],
                   sampling=sampling, max_tokens=n)


def _tokens(engine, request: Request) -> list[int]:
    tokens: list[int] = []
    for event in engine.generate(request):
        tokens += getattr(event, "token_ids", ())
    return tokens


def _together(engine, requests: list[Request]) -> list[list[int]]:
    """Every request submitted at once, each from its own thread (the runtime batches them)."""
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: _tokens(engine, r), requests))


def _load(executor: str, **options):
    """The torch executor as it ships: its layer pieces compiled by Inductor; llama.cpp with
    --exact-batching (its default f16 K changes a long prompt's bits by what shares its step:
    tests/engine/executors/test_kv_cache_types.py)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LOCALCHAT_EAGER", "0")
        return open_engine(EngineConfig("default", engine=executor, ctx_size=512, threads=2, parallel=16,
                           kv_memory=16 * 512 * 23040 if executor == "torch" else None,
                           exact_batching=executor == "llama.cpp", **options))


def _log_passes(executor) -> list[list]:
    """Wrap executor.forward to log each pass's chunks."""
    passes, forward = [], executor.forward

    def logged(chunks):
        passes.append(list(chunks))
        return forward(chunks)

    executor.forward = logged
    return passes


@pytest.fixture(scope="module", params=["llama.cpp", "torch"])
def runtime(request):
    engine = _load(request.param)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def alone(runtime):
    return [_tokens(runtime, _request(i)) for i in range(len(TOPICS))]


def test_greedy_batched_with_15_others_is_identical_to_alone(runtime, alone):
    before = runtime.runner.observer.steps_by_batch_size.copy()
    together = _together(runtime, [_request(i) for i in range(len(TOPICS))])
    assert together == alone
    assert max(runtime.runner.observer.steps_by_batch_size - before) >= 8  # they really shared steps


def test_seeded_sampling_batched_is_identical_to_alone(runtime):
    hot = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=100 + i,
                          repeat_penalty=1.0 + 0.05 * (i % 3)) for i in range(6)]
    alone = [_tokens(runtime, _request(i, hot[i])) for i in range(6)]
    assert _together(runtime, [_request(i, hot[i]) for i in range(6)]) == alone


@pytest.mark.parametrize("draft", ["default", "ngram"])
def test_greedy_with_a_draft_batched_is_identical(runtime, alone, draft):
    """The target drafting for itself (every draft right) and prompt lookup, while 8
    requests share each step: the tokens never change, only how many steps they take."""
    engine = _load(runtime.name, draft=DraftChoice.parse(draft, 3))
    try:
        verify = _log_passes(engine.runner.executor)
        drafting = _log_passes(engine.draft.executor) if draft == "default" else []
        results = _together(engine, [_request(i) for i in range(8)])
        assert results == alone[:8]
        stats = engine.memory()["draft"]
        assert stats["proposed"] > 0
        if draft == "default":  # the draft runs eagerly: its activations round apart now and then
            assert stats["acceptance_rate"] >= 0.8
            # one draft pass per draft position serves every speculating sequence
            assert max(sum(1 for c in p if c.n_logits == 1) for p in drafting) >= 4
        assert max(engine.runner.observer.steps_by_batch_size) > 1  # speculation no longer serialises requests
        # one verify pass: several sequences' drafts scored in the same forward (the target
        # drafting for itself drafts on every sequence; lookup only where a reply repeats, which
        # depends on the text the kernels' rounding leads to: 3 or 4 of 8 here)
        together = max(sum(1 for c in p if c.n_logits > 1) for p in verify)
        assert together >= (4 if draft == "default" else 2)
    finally:
        engine.close()


@pytest.mark.slow
def test_speculative_sampling_is_distributed_as_plain_sampling(tmp_path):
    """Token 3 of many seeded replies (the first a draft proposes for: token 2 times a
    plain step), plain vs drafted by a Q4_0 copy of the model (close to it, so drafts are
    often kept and sometimes rejected): a two-sample χ² test of homogeneity, on the
    llama.cpp executor."""
    from helpers.stats import chi_square_p_value

    from localchat.models.specs import resolve_model
    from quantize.gguf_quantize import quantize_gguf

    draft = quantize_gguf(resolve_model("default"), tmp_path / "q4_0.gguf", "Q4_0")
    sp = lambda seed: SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=seed)
    request = lambda seed: Request(messages=[Message("user", "Name a colour.")],
                                   sampling=sp(seed), max_tokens=4)
    n_requests, counts, drafts = 150, {}, []
    for name, options in (("plain", {}), ("draft", {"draft": DraftChoice.parse(str(draft), 2)})):
        engine = open_engine(EngineConfig("default", ctx_size=256, threads=2, parallel=16, **options))
        try:
            def work(i: int) -> tuple[list[int], dict | None]:
                events = list(engine.generate(request(i)))
                tokens = [t for e in events for t in getattr(e, "token_ids", ())]
                return tokens, events[-1].stats.draft

            with ThreadPoolExecutor(n_requests) as pool:
                results = list(pool.map(work, range(n_requests)))
            counts[name] = Counter(tokens[2] for tokens, _ in results if len(tokens) >= 3)
            drafts += [d for _, d in results if d]
        finally:
            engine.close()
    proposed, accepted = (sum(d[k] for d in drafts) for k in ("proposed", "accepted"))
    assert 0 < accepted < proposed  # drafts were proposed, kept, and sometimes rejected
    assert sum(counts["draft"].values()) > n_requests * 3 // 4
    total = counts["plain"] + counts["draft"]
    rare = {t for t, c in total.items() if c < 10}  # pooled, so every cell expects >= 5
    merged = {name: Counter("rare" if t in rare else t for t in c.elements())
              for name, c in counts.items()}
    pooled = merged["plain"] + merged["draft"]
    expected = {t: c / sum(pooled.values()) for t, c in pooled.items()}
    n = sum(merged["draft"].values())
    assert chi_square_p_value(merged["draft"], expected, n) > 1e-3


def test_llama_cpp_slots_reuse_a_chat_and_a_shared_system_prompt():
    engine = open_engine(EngineConfig("default", ctx_size=1024, threads=2, parallel=2))
    try:
        system = [Message("system", "You are a terse assistant who answers in one line.")]
        first = engine.complete(Request(messages=system + [Message("user", "Hi")],
                                        sampling=GREEDY, max_tokens=8))
        turn2 = system + [Message("user", "Hi"), Message("assistant", first.text),
                          Message("user", "And then?")]
        second = engine.complete(Request(messages=turn2, sampling=GREEDY, max_tokens=8))
        assert second.stats.cached_tokens >= first.stats.prompt_tokens
        other = engine.complete(Request(messages=system + [Message("user", "Name a bird.")],
                                        sampling=GREEDY, max_tokens=8))
        system_tokens = len(engine.tokenize_messages(system))
        assert other.stats.cached_tokens >= system_tokens - 2  # up to the user turn's start
    finally:
        engine.close()


def test_more_requests_than_slots_wait_their_turn():
    """Six requests on two llama.cpp slots: at most two run at once, and each gets the
    tokens it gets alone."""
    engine = open_engine(EngineConfig("default", ctx_size=512, threads=2, parallel=2))
    try:
        alone = [_tokens(engine, _request(i)) for i in range(6)]
        before = engine.runner.observer.steps_by_batch_size.copy()
        assert _together(engine, [_request(i) for i in range(6)]) == alone
        assert max(engine.runner.observer.steps_by_batch_size - before) == 2
    finally:
        engine.close()
