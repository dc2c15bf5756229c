"""The default-engine rule's probe: each executor loaded on a model file and timed (a first
token, one stream, 8 streams at once), said on stderr first and kept (engine_figures.py).
Called by choose() through open_engine's package, never by the rule itself."""

from __future__ import annotations

import sys
import threading
import time

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.choice import choose
from localchat.engine.config import NO_DRAFT, EngineConfig
from localchat.engine.engine_figures import Figures, figures_path, keep
from localchat.engine.loading import load_runtime
from localchat.models.facts import GGUFFacts

PROBE_CTX = 512
PROBE_STREAMS = 8  # the many-streams figure: this many requests decoding at once
ONE_STREAM_TOKENS = 48
MANY_STREAM_TOKENS = 32
# Each request's own text from its first word (no prefix-cache hit past the template):
# about 120 tokens, a typical chat prompt.
PROBE_PROMPT = ("Question {i}: summarise, in plain words for a curious twelve-year-old, why the "
                "sky looks blue in the middle of the day and red or orange at sunset. Explain "
                "what scattering of light is, why shorter wavelengths scatter more than longer "
                "ones, and how the length of the path that sunlight takes through the air "
                "changes which colours reach the eye. Then say why clouds look white or grey, "
                "why the sea often looks blue too, and whether the sky on Mars has the same "
                "colours, giving one short reason for each answer.")
MANY_PROMPT = "Question {i}: why does the sky look blue in the day and red at sunset?"


def measure_engines(facts: GGUFFacts, threads: int, engines: tuple[str, ...],
                    say=None) -> dict[str, Figures]:
    """Measure each engine on this file, and keep the figures; what it does is said first,
    by say(line) (the chat's notice) or on stderr."""
    line = (f"measuring {' and '.join(engines)} on {facts.name} to choose the faster (once "
            f"for this file and CPU; kept in {figures_path()})")
    if say is not None:
        say(line)
    else:
        print(f"localchat: {line}", file=sys.stderr, flush=True)
    figures = {name: measure(facts, name, threads) for name in engines}
    keep(facts, threads, figures)
    return figures


def measure(facts: GGUFFacts, engine: str, threads: int) -> Figures:
    """Load the file on `engine` (no draft) and time a first token, one stream, and
    PROBE_STREAMS streams at once."""
    config = EngineConfig(str(facts.path), engine=engine, ctx_size=PROBE_CTX, threads=threads,
                          draft=NO_DRAFT, kv_disk=0,
                          parallel=PROBE_STREAMS if engine == "llama.cpp" else None)
    greedy = SamplingParams(temperature=0.0)

    def request(i: int, n: int, text: str = PROBE_PROMPT) -> Request:
        return Request(messages=[Message("user", text.format(i=i))], sampling=greedy,
                       max_tokens=n)

    start = time.perf_counter()
    try:  # an executor that fails here is no candidate: the other runs the file
        loaded = load_runtime(choose(config))
        try:
            loaded.complete(request(0, 1))
            start_s = time.perf_counter() - start
            one = loaded.complete(request(1, ONE_STREAM_TOKENS)).stats
            many = many_streams(loaded, [request(100 + i, MANY_STREAM_TOKENS, MANY_PROMPT)
                                         for i in range(PROBE_STREAMS)])
        finally:
            loaded.close()
    except Exception as exc:  # noqa: BLE001 -- any failure: said in the reason, kept
        text = str(exc).strip()
        return Figures(failed=text.splitlines()[0][:200] if text else type(exc).__name__)
    return Figures(start_s, one.prefill_tok_s, one.decode_tok_s, many)


def many_streams(engine, requests) -> float:
    """Tokens/s of all the requests at once, each on its own thread (the runtime batches)."""
    counts = [0] * len(requests)

    def work(i: int) -> None:
        counts[i] = engine.complete(requests[i]).stats.completion_tokens

    began = time.perf_counter()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(requests))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / max(1e-9, time.perf_counter() - began)
