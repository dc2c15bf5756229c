"""`localchat plan`: its arithmetic, and agreement with both engines' own accounting."""

from __future__ import annotations

import json

import pytest

from localchat.errors import UsageError
from localchat.models.planner import build_plan, context_that_fits, model_size
from localchat.models.specs import resolve_model_facts
from localchat.units import parse_memory

from helpers.cli import localchat


@pytest.fixture(scope="module")
def size():
    return model_size(resolve_model_facts("default"))


def test_weights_bytes_agree_with_llama_cpps_model_size(size, engine):
    assert size.weights_bytes == engine.info.weights_bytes
    assert size.weights_bytes_as("Q4_1") == size.weights_bytes
    assert 134e6 < size.n_params < 136e6


def test_kv_bytes_per_token_agree_with_both_engines(size, engine, torch_engine):
    assert size.kv_bytes_per_token("f16") == engine.info.kv_bytes_per_token == 23040
    assert size.kv_bytes_per_token("f16") == torch_engine.info.kv_bytes_per_token
    assert size.kv_bytes_per_token("q8_0/f16") == 17640  # llama.cpp with --exact-batching
    # the torch engine's pool holds 2 x 1024 tokens of f16 KV
    assert torch_engine.blocks.usage().bytes(torch_engine.info.kv_bytes_per_token)["total"] == \
        2048 * size.kv_bytes_per_token("f16")
    assert size.kv_bytes_per_token("f32") == 2 * 23040


def test_context_and_users_arithmetic(size):
    per_token = size.kv_bytes_per_token("f16")
    memory = size.weights_bytes + 10 * 4096 * per_token + per_token - 1
    assert context_that_fits(size, memory, "f16") == 10 * 4096
    plan = build_plan(size, [memory, size.weights_bytes // 2], 4096)
    assert plan["budgets"][0]["kv"]["f16"] == {"tokens": 40960, "users_at_context": 10}
    assert plan["budgets"][1]["kv"]["f16"] == {"tokens": 0, "users_at_context": 0}
    assert plan["budgets"][0]["kv"]["q8_0"]["users_at_context"] > 10


@pytest.mark.parametrize("text, value", [("8GB", 8 * 10**9), ("16GiB", 16 * 2**30),
                                         ("512MiB", 512 * 2**20), ("1e9", 10**9)])
def test_parse_memory(text, value):
    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["", "8XB", "-1GB", "0GB", "GB"])
def test_bad_memory_sizes_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_memory(text)


@pytest.mark.subprocess
def test_plan_command_json_and_table():
    run = lambda *a: localchat("plan", *a)
    out = run("--memory", "1GB,8GB", "-c", "2048", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert [b["memory_bytes"] for b in plan["budgets"]] == [10**9, 8 * 10**9]
    table = run("--memory", "8GB")
    assert "users at 4096 tokens" in table.stdout and "q8_0" in table.stdout
    bad = run("--memory", "lots")
    assert bad.returncode == 2 and bad.stderr.startswith("localchat: error: ")
