"""`bench --concurrency N` with a draft: N concurrent drafted requests against the same N plain
on the real bundled model, alternated, with identical replies."""

from __future__ import annotations

import pytest

from localchat.bench.concurrent_drafts import bench_concurrent_drafts
from localchat.bench.concurrent_drafts import format_concurrent_drafts
from localchat.engine.config import EngineConfig


@pytest.mark.slow
def test_concurrent_requests_with_a_self_draft_match_plain_and_accept_every_draft():
    """The bundled model drafting for itself: every draft it proposes is kept, and the 3
    batched replies are exactly the plain engine's."""
    config = EngineConfig("default", engine="llama.cpp", ctx_size=1024, threads=2,
                          draft="default")
    report = bench_concurrent_drafts(config, [3])
    row = report["levels"]["3"]
    assert row["identical_output"] is True
    assert row["proposed"] > 0 and row["alpha"] == 1.0
    assert row["no_draft_tok_s"] > 0 and row["draft_tok_s"] > 0
    assert row["speedup"] == pytest.approx(row["draft_tok_s"] / row["no_draft_tok_s"])
    assert "   3 " in format_concurrent_drafts(report)
