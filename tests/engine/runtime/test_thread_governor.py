"""The thread governor on simulated step times (a machine whose other processes come and go),
and on the real bundled model: llama.cpp decodes the same tokens whatever the thread count,
and a runner with adapt_threads drives the executor's count."""

from __future__ import annotations

import pytest

from localchat.engine.runtime.thread_governor import FIRST_PROBE_AFTER, ThreadGovernor

KEY = (1, 1)  # one sequence decoding one token


class Machine:
    """Step time for n threads on `cores` cores while `busy` of them run another process:
    a thread sharing a core with it stalls every thread at each barrier."""

    def __init__(self, cores: int, busy: int = 0) -> None:
        self.cores, self.busy, self.threads, self.calls = cores, busy, cores, []

    def set_threads(self, n: int) -> None:
        self.threads = n
        self.calls.append(n)

    def step_s(self) -> float:
        n, free = self.threads, self.cores - self.busy
        base = 0.010 * self.cores / n  # perfect scaling on free cores
        return base * (3.0 if n > free else 1.0)


def run(governor: ThreadGovernor, machine: Machine, steps: int, key=KEY) -> list[int]:
    used = []
    for _ in range(steps):
        governor.before_step(key)
        used.append(machine.threads)
        governor.observe(key, machine.step_s())
    return used


def test_a_quiet_machine_keeps_every_core_and_probes_less_and_less():
    machine = Machine(cores=2)
    governor = ThreadGovernor(2, machine.set_threads, interval=64, probe_steps=6)
    used = run(governor, machine, 2100)
    assert governor.threads == 2 and governor.switches == 0
    # probes after 16 steps, then 128, 256, 512, 1024 apart; one thread is 2x slower, so
    # each stops after 2 steps of it (2 of each count) rather than 6
    assert used.count(1) == 2 * 5
    assert sum(n == 1 for n in used[-500:]) <= 2


def test_a_busy_core_moves_to_fewer_threads_and_back_when_it_frees():
    machine = Machine(cores=2)
    governor = ThreadGovernor(2, machine.set_threads, interval=64, probe_steps=6)
    run(governor, machine, 300)
    machine.busy = 1  # steps at 2 threads slow down 3x: the governor probes at once
    used = run(governor, machine, 40)
    assert governor.threads == 1 and used[-1] == 1
    assert used.index(1) <= 9  # within the 8-step window that shows the slowdown
    machine.busy = 0  # 1 thread runs as before; the periodic probe finds 2 faster again
    run(governor, machine, 200)
    assert governor.threads == 2 and governor.switches == 2


def test_many_cores_walk_down_one_thread_at_a_time_to_the_free_ones():
    machine = Machine(cores=8, busy=2)
    governor = ThreadGovernor(8, machine.set_threads, interval=16, probe_steps=4)
    run(governor, machine, 400)
    assert governor.threads == 6  # 7 or 8 threads share a busy core; 5 is slower than 6
    quiet = Machine(cores=8)
    governor = ThreadGovernor(8, quiet.set_threads, interval=16, probe_steps=4)
    run(governor, quiet, 3000)
    assert governor.threads == 8 and min(quiet.calls) == 4  # probes 7, 6, then 4, never less


def test_each_step_shape_is_compared_with_itself():
    """Steps of two shapes interleaved (a decode step and a 4-draft round, 5x its cost):
    the probe alternates the counts on each shape, so each is compared with itself (an
    alternation over all steps had run every round at one count: nothing comparable)."""
    machine = Machine(cores=2, busy=1)
    governor = ThreadGovernor(2, machine.set_threads, interval=8, probe_steps=3)
    run(governor, machine, FIRST_PROBE_AFTER)  # the first probe starts
    seen = set()
    for i in range(12):
        key = (1, 1) if i % 2 else (1, 5)
        governor.before_step(key)
        seen.add((key, machine.threads))
        governor.observe(key, machine.step_s() * key[1])
    assert seen == {((1, 1), 1), ((1, 1), 2), ((1, 5), 1), ((1, 5), 2)}
    assert governor.threads == 1  # one core is busy: 1 thread wins on either shape
    run(governor, machine, 30, key=None)  # prefill steps: not timed, no probe
    assert governor.threads == 1 and set(machine.calls) <= {1, 2}


def test_a_step_of_a_new_shape_runs_at_the_current_count_during_a_probe():
    """A speculative round whose γ was not seen in the probe has nothing to be compared
    with at the candidate count: it runs at the chosen one, and says so (settled)."""
    machine = Machine(cores=2)
    governor = ThreadGovernor(2, machine.set_threads, interval=8, probe_steps=3)
    run(governor, machine, FIRST_PROBE_AFTER)  # the first probe starts
    assert governor._probe is not None
    governor.before_step((1, 9))  # a 8-draft round
    assert machine.threads == 2 and governor.settled
    governor.observe((1, 9), machine.step_s())
    governor.before_step((1, 9))  # the same shape again: now the candidate's turn
    assert machine.threads == 1 and not governor.settled
    governor.before_step(None)  # drafting, before the step's shape is known
    assert machine.threads == 2 and governor.settled


def test_a_probe_of_shapes_that_never_repeat_ends():
    machine = Machine(cores=2)
    governor = ThreadGovernor(2, machine.set_threads, interval=8, probe_steps=3)
    run(governor, machine, FIRST_PROBE_AFTER)
    for g in range(2, 2 + 12):  # every round a new γ: all at the current count
        governor.before_step((1, g))
        governor.observe((1, g), machine.step_s())
    assert governor._probe is None and set(machine.calls) == {2}


@pytest.fixture(scope="module")
def bundled():
    from localchat.models.files import validate_model_file
    from localchat.models.specs import resolve_model

    return validate_model_file(resolve_model("default"))


@pytest.mark.model
def test_llama_cpp_gives_the_same_logits_on_one_thread_and_two(bundled):
    """Prefill and a one-token decode step (where flash attention might split the KV)."""
    import numpy as np

    from localchat.engine.executors.llamacpp import LlamaCppExecutor
    from localchat.engine.runtime.executor_api import Chunk

    executor = LlamaCppExecutor(bundled, n_ctx=256, threads=2, parallel=1)
    try:
        prompt = executor.vocab.tokenize_text("The three primary colors are red, yellow and" * 8)
        runs = []
        for threads in (2, 1, 2):
            assert executor.set_threads(threads) and executor.threads == threads
            prefill = executor.forward([Chunk(slot=0, tokens=prompt, start=0, n_logits=len(prompt),
                                              block_table=[], write_from=0, n_prompt=len(prompt))])
            step = executor.forward([Chunk(slot=0, tokens=[int(prefill[-1].argmax())],
                                           start=len(prompt), n_logits=1, block_table=[],
                                           write_from=len(prompt), n_prompt=len(prompt))])
            runs.append(np.concatenate([prefill, step]))
        assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])
    finally:
        executor.close()


@pytest.mark.model
def test_an_engine_without_named_threads_probes_fewer_and_decodes_the_same_tokens(all_cpus):
    from helpers.replies import reply_tokens
    from localchat.engine import EngineConfig, open_engine

    prompt = "Write a Python function that reverses a string."
    fixed = open_engine(EngineConfig("default", engine="llama.cpp", ctx_size=512, threads=2))
    try:
        assert fixed.runner.observer.threads is None  # the user named a count: it is kept
        expected, _ = reply_tokens(fixed, prompt, 48)
    finally:
        fixed.close()
    governed = open_engine(EngineConfig("default", engine="llama.cpp", ctx_size=512))
    try:
        governor = governed.runner.observer.threads
        governor.interval = governor.base_interval = 4  # probe often
        got, _ = reply_tokens(governed, prompt, 48)
        assert got == expected
        assert governor.probes >= 2 and 1 in governor.counts_used
    finally:
        governed.close()


@pytest.mark.model
def test_drafted_rounds_run_at_the_chosen_count_while_the_governor_probes(all_cpus):
    """Prompt lookup × the thread governor on llama.cpp: a quoting reply decodes the same
    tokens as a fixed count without drafts, and each round whose shape the probe had not
    timed yet ran at the chosen count (every other round had run at the candidate's 1
    thread, 1.35x slower, and taught the speculation cost model its times). A fixed γ, so
    that rounds happen whatever the machine's load (the adaptive one follows timings)."""
    from helpers.replies import reply_tokens
    from dataclasses import replace

    from localchat.bench.speculative import TASKS
    from localchat.engine import EngineConfig, open_engine
    from localchat.engine.config import DraftChoice

    prompt = TASKS["quote"][0]
    base = EngineConfig("default", engine="llama.cpp", ctx_size=512, exact_batching=True)
    fixed = open_engine(replace(base, threads=2))
    try:
        expected, _ = reply_tokens(fixed, prompt, 64)
    finally:
        fixed.close()
    drafted = open_engine(replace(base, draft=DraftChoice("ngram", tokens=4)))
    try:
        governor = drafted.runner.observer.threads
        governor.interval = governor.base_interval = 4  # probe often
        steps = []  # (shape, probing, count applied, count chosen) per step
        before_step = governor.before_step

        def logged(key):
            before_step(key)
            if key is not None:
                steps.append((key, governor._probe is not None, governor._applied,
                              governor.threads))

        governor.before_step = logged
        got, draft = reply_tokens(drafted, prompt, 64)
    finally:
        drafted.close()
    assert got == expected
    assert draft["accepted"] >= 30, draft
    seen: set = set()
    new_rounds = []
    for key, probing, applied, chosen in steps:
        if probing and key[1] > 1 and key not in seen:
            new_rounds.append(applied == chosen)
        seen.add(key)
        if not probing:
            seen.clear()
    assert new_rounds and all(new_rounds), steps
    assert 1 in governor.counts_used  # the probe ran
