"""Speculative decoding through both engines on the real bundled model: greedy output
identical to plain decoding, a self-draft accepting everything, real distributions
kept exact, a useless draft switched off, and clear errors for drafts that cannot work."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from helpers.replies import reply_tokens
import numpy as np
import torch

from localchat.engine.config import DraftChoice
from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import Message, SamplingParams
from localchat.engine.runtime.sampler import Row, distributions
from localchat.engine.runtime.speculative.rule import accept_drafts
from helpers.tiny_models import write_random_model

from helpers.cli import localchat

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ("Write a Python function that reverses a string.",
           "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox")
N_TOKENS = 40


def reply(engine, prompt: str, sampling=GREEDY, n=N_TOKENS) -> tuple[list[int], dict | None]:
    return reply_tokens(engine, prompt, n, sampling)


@pytest.fixture(scope="module")
def plain_replies(torch_engine):
    return [reply(torch_engine, p)[0] for p in PROMPTS]


@pytest.fixture(scope="module")
def useless_draft(tmp_path_factory):
    """Random weights, the bundled model's vocabulary: it almost never guesses right."""
    return write_random_model(tmp_path_factory.mktemp("draft") / "random.gguf")


# adaptive γ with either draft is tested batched in test_runtime.py; these two are slow
@pytest.mark.parametrize("draft,k", [pytest.param("default", 1, marks=pytest.mark.slow),
                                     ("default", 4),
                                     pytest.param("ngram", None, marks=pytest.mark.slow)])
def test_torch_greedy_speculation_is_identical_to_plain_decoding(plain_replies, draft, k):
    eng = open_engine(EngineConfig("default", engine="torch", ctx_size=1024, threads=2,
                      kv_memory=1024 * 23040, draft=DraftChoice.parse(draft, k)))
    try:
        for prompt, plain in zip(PROMPTS, plain_replies):
            tokens, stats = reply(eng, prompt)
            assert tokens == plain, prompt
            assert stats["source"].startswith("model:" if draft == "default" else "ngram")
            if draft == "default":  # the target drafting for itself: everything accepted
                assert stats["proposed"] > 0 and stats["acceptance_rate"] == 1.0
                assert stats["tokens_per_target_pass"] > 1.5
    finally:
        eng.close()


def test_useless_draft_is_switched_off_and_changes_nothing(plain_replies, useless_draft, all_cpus):
    eng = open_engine(EngineConfig("default", engine="torch", ctx_size=1024, threads=2,
                      kv_memory=1024 * 23040, draft=str(useless_draft)))
    try:
        tokens, stats = reply(eng, PROMPTS[0])
        assert tokens == plain_replies[0]
        print(stats)
        assert stats["acceptance_rate"] < 0.3
        # adaptation: after the first rounds fail, most target passes are plain steps
        rounds = sum(stats["accepted_run_histogram"].values())
        assert rounds < N_TOKENS / 2 and stats["predicted_speedup"] < 1.0
    finally:
        eng.close()


def test_real_distributions_stay_exact(torch_engine, useless_draft):
    """First-token frequencies under the acceptance rule with the bundled model's real
    next-token distribution p and a real (poor) draft distribution q: χ² against p."""
    from helpers.stats import chi_square_p_value

    from localchat.engine.executors.torch.model import KVStore
    from localchat.engine.executors.torch.weights import load_weights

    prompt = torch_engine.tokenize_messages([Message("user", "Name a colour.")])
    params = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)

    def last_logits(model_weights):
        from localchat.engine.executors.torch.model import LlamaModel

        m = LlamaModel(model_weights, 256)
        n = len(prompt)
        return m.forward(torch.tensor(prompt), torch.arange(n), torch.arange(n), torch.arange(n),
                         KVStore(m.config, 256)).float().numpy()

    p = distributions(last_logits(torch_engine.executor.model.w)[None], [Row(params)])[0]
    q = distributions(last_logits(load_weights(useless_draft))[None], [Row(params)])[0]
    assert (p > 0).sum() == 8 and (q > 0).sum() == 8
    g = np.random.default_rng(0)
    n = 2000
    counts = Counter()
    for _ in range(n):
        d = int(g.choice(len(q), p=q))
        kept, nxt = accept_drafts(np.stack([p, p]), q[None], [d], g)
        counts[d if kept else nxt] += 1
    expected = {i: float(p[i]) for i in range(p.size) if p[i] > 0}
    assert chi_square_p_value(counts, expected, n) > 1e-3


def test_llama_cpp_speculation_is_identical_and_self_draft_accepts_all(exact_engine):
    plain = [reply(exact_engine, p)[0] for p in PROMPTS]
    for draft in ("default", "ngram"):
        eng = open_engine(EngineConfig("default", ctx_size=1024, threads=2, exact_batching=True,
                                       draft=DraftChoice.parse(draft, 3)))
        try:
            for prompt, expected in zip(PROMPTS, plain):
                tokens, stats = reply(eng, prompt)
                assert tokens == expected
                assert "Leviathan" in stats["rule"]
                if draft == "default":
                    assert stats["proposed"] > 0 and stats["acceptance_rate"] == 1.0
        finally:
            eng.close()


@pytest.mark.model
@pytest.mark.subprocess
def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    other = write_random_model(tmp_path / "other-vocab.gguf", renamed_token=1000)
    for engine_name in ("torch", "llama.cpp"):
        done = localchat("run", "--engine", engine_name, "--draft-model", str(other), "hi", timeout=300)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("localchat: error: --draft-model ") and "token 1000" in done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.subprocess
def test_draft_flag_errors_are_one_line():
    cases = [("--no-draft", "--num-draft-tokens", "3"), ("--draft-model", "nope/missing.gguf"),
             ("--draft", "ngram", "--num-draft-tokens", "0")]
    for args in cases:
        done = localchat("run", *args, "hi", timeout=300)
        assert done.returncode != 0 and done.stderr.startswith("localchat: error:"), args
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.subprocess
def test_json_result_carries_draft_stats():
    done = localchat("run", "--engine", "torch", "--draft", "ngram", "--temp", "0", "-n", "24",
                      "--json", PROMPTS[1])
    assert done.returncode == 0, done.stderr
    draft = json.loads(done.stdout)["draft"]
    for key in ("proposed", "accepted", "acceptance_rate", "tokens_per_target_pass",
                "accepted_run_histogram", "gamma", "predicted_speedup", "measured_speedup", "rule"):
        assert key in draft


@pytest.mark.subprocess
@pytest.mark.parametrize("draft", ["ngram", pytest.param("default", marks=pytest.mark.slow)])
def test_llama_cpp_speculation_runs_past_512_tokens(draft):
    """The old engine died at n_past = 512 with either draft (a broadcast error in
    llama-cpp-python's eval); the runtime's executor must go on to -n. A ~470-token prompt
    to copy from gets there in a few dozen drafted tokens."""
    items = ", ".join(f"item {i}" for i in range(90))
    done = localchat("run", "--draft" if draft == "ngram" else "--draft-model", draft,
                      "--temp", "0", "-n", "96", "--no-history", "--json",
                      f"Repeat this list exactly: {items}")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    out = json.loads(done.stdout)
    assert out["completion_tokens"] == 96 and out["context_tokens"] - 96 < 512 < out["context_tokens"]
    assert out["draft"]["proposed"] > 0


@pytest.mark.model
def test_auto_draft_is_prompt_lookup_without_a_kept_draft_and_skips_seeded_requests():
    engine = open_engine(EngineConfig("default", threads=2, ctx_size=512, draft="auto"))
    try:
        assert engine.draft.source == "ngram" and engine.draft.auto
        tokens, draft = reply(engine, PROMPTS[1], n=12)
        assert draft is not None and draft["source"] == "ngram"
        seeded = SamplingParams(temperature=0.8, seed=7)
        first, draft = reply(engine, PROMPTS[0], seeded, n=12)
        assert draft is None  # a seeded request stays reproducible: no speculation
        assert reply(engine, PROMPTS[0], seeded, n=12)[0] == first
    finally:
        engine.close()


@pytest.mark.model
def test_auto_with_a_kept_draft_looks_up_first_then_asks_the_model(useless_draft):
    """A kept draft (here random weights) joins prompt lookup; greedy output is unchanged.
    Passes are charged to a fake clock as on a bandwidth-bound target, so the controller's
    decisions do not depend on this machine's timings (quiet, the measured verify cost
    turned lookup off before the repeat)."""
    from helpers.fake_clock import clocked_with_draft, tokens_of
    from localchat.models.drafts import draft_path_for
    from localchat.models.specs import resolve_model_facts

    kept = draft_path_for(resolve_model_facts("default"))
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.symlink_to(useless_draft)
    engine = open_engine(EngineConfig("default", threads=2, ctx_size=512, draft="auto"))
    try:
        assert engine.draft.source.startswith("ngram+model:")
        clocked_with_draft(engine, lambda ch: 1.0 + 0.005 * tokens_of(ch),
                           lambda ch: 0.1 + 0.002 * tokens_of(ch))
        for prompt in PROMPTS:
            tokens, draft = reply(engine, prompt)
            assert draft["source"].startswith("ngram+model:")
            seeded = SamplingParams(temperature=0.0, seed=1)  # auto: seeded requests never draft
            plain, no_draft = reply(engine, prompt, seeded)
            assert no_draft is None and tokens == plain
        assert draft["proposed"] > 0 and draft["accepted"] > 0  # the repeat: lookup drafted
    finally:
        engine.close()


@pytest.mark.subprocess
@pytest.mark.slow
def test_bench_reports_the_speculative_section_per_task():
    done = localchat("bench", "--engines", "llama.cpp", "-p", "16", "-g", "16", "-r", "1",
                     "--draft", "ngram", "--json", timeout=1200)  # 3 loads, 27 replies, 108 one-shot
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)["speculative"]
    assert spec["source"] == "ngram" and set(spec["tasks"]) == {"chat", "quote"}
    for task in spec["tasks"].values():
        assert task["identical_output"] is True  # greedy speculation never changes the text
        for key in ("alpha", "c", "beta", "speedup", "predicted_speedup", "no_draft_tok_s"):
            assert key in task
    assert spec["speedup"] == spec["tasks"]["chat"]["speedup"]
    for one_shot in (spec["short"], spec["quote_one_shot"]):  # each reply from a fresh engine
        assert one_shot["identical_output"] is True
    assert spec["quote_one_shot"]["prompts"] == 3 and spec["quote_one_shot"]["alpha"] > 0.9


@pytest.mark.model
def test_repeated_quoting_drafts_from_its_first_tokens_and_keeps_plain_decodings_text():
    """A quoting reply's first tokens follow 2- to 7-token matches, where a reply had no
    credit for a round: they decoded plain in every reply, as their match lengths never got
    measured rounds. Each such plain step now judges the lookup's guess for free: a reply's
    own first 3 right guesses vouch for a round (the first reply had led with 5+ plain steps),
    and after a few quoting replies a quote drafts from its first tokens. Passes are charged to a fake
    clock (a compute-bound target: 1 + 0.5 steps a draft), so the decisions are this
    model's, not this machine's; exact batching, so the text must be plain decoding's."""
    from helpers.fake_clock import Clock, tokens_of
    from localchat.bench.speculative import TASKS

    engine = open_engine(EngineConfig("default", engine="llama.cpp", threads=2, ctx_size=1024,
                                      exact_batching=True, draft="auto"))
    try:
        clock = Clock()
        engine.runner.clock = clock
        passes = clock.charge(engine.runner.executor, lambda ch: 0.01 * (
            1 + 0.5 * (tokens_of(ch) - 1) if tokens_of(ch) <= 17 else 0.3 * tokens_of(ch)))
        prompt = TASKS["quote"][0]
        plain = reply(engine, prompt, SamplingParams(temperature=0.0, seed=1), n=32)[0]
        leads = []  # plain decode steps before each reply's first round
        for _ in range(5):
            passes.clear()
            tokens, stats = reply(engine, prompt, n=32)
            assert tokens == plain and stats["accepted"] > 0
            sizes = [sum(n for n, _ in p) for p in passes[1:]]  # after the prompt's pass
            leads.append(next(i for i, n in enumerate(sizes) if n > 1))
        assert leads[0] <= 3 and leads[-1] <= 1, leads
    finally:
        engine.close()
