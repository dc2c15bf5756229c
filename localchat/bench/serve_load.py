"""N concurrent streaming chat completions against one OpenAI-compatible server: each
client's TTFT, completion tokens (the server's usage) and decode rate, and the aggregate
completion tok/s from the first send to the last finish."""

from __future__ import annotations

import json
import math
import statistics
import threading
import time

from localchat.errors import EngineError

REQUEST_TIMEOUT_S = 1800.0


def chat_body(model: str, messages: list[dict], max_tokens: int) -> dict:
    """Greedy, streamed, with the usage chunk at the end."""
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}


def served_model(client) -> str:
    """The id of the (one) model the server lists."""
    response = client.get("/v1/models")
    if response.status_code != 200:
        raise EngineError(f"GET /v1/models answered {response.status_code}")
    return response.json()["data"][0]["id"]


def stream_one(client, body: dict, start: float) -> dict:
    """One streamed completion; times are seconds since `start`. completion_tokens comes
    from the usage chunk (tokens_from "usage"), else the content deltas are counted."""
    sent = time.perf_counter() - start
    first = None
    deltas, usage, finish, text = 0, None, None, []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise EngineError(f"POST /v1/chat/completions answered {response.status_code}: "
                              f"{response.text[:200]}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if first is None:
                        first = time.perf_counter() - start
                    deltas += 1
                    text.append(content)
                finish = choice.get("finish_reason") or finish
    finished = time.perf_counter() - start
    tokens = usage["completion_tokens"] if usage else deltas
    ttft = (first if first is not None else finished) - sent
    decode_s = finished - (first if first is not None else finished)
    return {"completion_tokens": tokens, "tokens_from": "usage" if usage else "deltas",
            "content_deltas": deltas, "finish_reason": finish, "ttft_s": ttft,
            "decode_tok_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else None,
            "sent_s": sent, "finished_s": finished, "text": "".join(text)}


def run_clients(url: str, conversations: list[list[dict]], max_tokens: int) -> dict:
    """One client thread per conversation, all released at once; summary() of their
    results. A client that fails is an EngineError once all have ended."""
    import httpx2

    n = len(conversations)
    results: list[dict | None] = [None] * n
    errors: list[str] = []
    gate = threading.Barrier(n + 1)
    # a fresh connection per request: llama-server may close a kept-alive one after a
    # stream, and a client reusing it then fails ("disconnected without a response")
    limits = httpx2.Limits(max_connections=n, max_keepalive_connections=0)
    with httpx2.Client(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        model = served_model(client)
        stream_one(client, chat_body(model, [{"role": "user", "content": "Hi"}], 4), 0.0)
        start = 0.0

        def work(i: int) -> None:
            try:
                gate.wait()
                results[i] = stream_one(client, chat_body(model, conversations[i], max_tokens),
                                        start)
            except Exception as exc:  # reported below, after every client has ended
                errors.append(f"client {i}: {exc}")

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
        for thread in threads:
            thread.start()
        start = time.perf_counter()
        gate.wait()
        for thread in threads:
            thread.join()
    if errors:
        raise EngineError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1
                                       else ""))
    return summary([r for r in results if r is not None])


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q <= 1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(clients: list[dict]) -> dict:
    """Aggregate tok/s (all completion tokens / first send to last finish), TTFT median
    and p90, the clients' median decode rate, and the clients themselves."""
    total = sum(c["completion_tokens"] for c in clients)
    wall = max(c["finished_s"] for c in clients) - min(c["sent_s"] for c in clients)
    ttfts = [c["ttft_s"] for c in clients]
    rates = [c["decode_tok_s"] for c in clients if c["decode_tok_s"] is not None]
    return {"aggregate_tok_s": total / wall, "completion_tokens": total, "wall_s": wall,
            "ttft_p50_s": statistics.median(ttfts), "ttft_p90_s": percentile(ttfts, 0.9),
            "decode_tok_s_median": statistics.median(rates) if rates else None,
            "clients": clients}
