"""`bench --task json` on the real bundled model: the constrained replies are valid JSON,
the forced drafts change the passes but not the text, and the report says so."""

from __future__ import annotations

import json

import pytest

from localchat.bench.json_task import TASKS, bench_json
from localchat.bench.json_task import format_json_report


# slow (~16 s): the benchmark's own report; forced drafts changing nothing but the steps is
# checked by default in tests/engine/runtime/test_constraint.py
@pytest.mark.slow
def test_json_bench_checks_validity_and_identity(engine):
    r = bench_json(engine, gen_tokens=100)
    n = len(TASKS)
    assert r["constrained"]["valid"] == r["forced_drafts"]["valid"] == f"{n}/{n}"
    assert r["forced_identical"] is True
    # the forced tokens were verified in fewer target passes than tokens
    forced = r["forced_drafts"]
    assert forced["forced_share"] > 0 and forced["target_passes"] < forced["tokens"]
    assert r["constrained"]["target_passes"] >= r["constrained"]["tokens"]
    report = format_json_report("llama.cpp", r)
    assert f"valid {n}/{n}" in report and "x free decode" in report
    json.dumps(r)  # what `bench --json` prints
