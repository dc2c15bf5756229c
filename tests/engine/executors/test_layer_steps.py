"""The torch executor's layer pieces compiled by Inductor against the same pieces run eagerly,
on the real bundled model: the same next tokens, logits within bfloat16 rounding, and the
choice between them (LOCALCHAT_EAGER, the kernels report)."""

from __future__ import annotations

import pytest
import torch
from helpers.teacher_forced import teacher_forced

from localchat.engine.executors.torch.layer_steps import compiles_by_default
from localchat.engine.executors.torch.model import LlamaModel
from localchat.engine.executors.torch.weights import load_weights
from localchat.models.specs import resolve_model_facts


@pytest.fixture(scope="module")
def reference(engine):
    """The bundled model's weights, 96 tokens of varied text and their eager logits (a
    prompt of 64, then one token a step): what each compiled form is compared with."""
    from quantize.agreement import varied_text_tokens

    weights = load_weights(resolve_model_facts("default").path)
    tokens = torch.tensor(varied_text_tokens(engine, 96)[:96])
    return weights, tokens, teacher_forced(LlamaModel(weights, 256, compiled=False), tokens, 64)


def test_compiled_layers_give_the_eager_tokens(reference):
    weights, tokens, eager = reference
    compiled = teacher_forced(LlamaModel(weights, 256, compiled=True), tokens, 64)
    assert torch.equal(eager[:64], compiled[:64])  # prompt layers run eagerly in both
    agree = (eager.argmax(-1) == compiled.argmax(-1)).float().mean().item()
    # two bfloat16 roundings of one float32 computation: a last-bit difference in a norm can
    # round an activation the other way (about as often as two llama.cpp K cache types differ)
    assert agree >= 0.95, agree
    assert (eager - compiled).abs().max().item() < 1.5  # bfloat16 activations round alike


# slow: a compiled target's AOTInductor decode layers are checked against llama.cpp in
# test_q4q8.py, and the AOTInductor artifact against eager by the draft test below
@pytest.mark.slow
def test_ahead_of_time_layers_give_the_eager_tokens(reference):
    weights, tokens, eager = reference
    model = LlamaModel(weights, 256, compiled=True)
    ahead = teacher_forced(model, tokens, 64, warm=True)
    assert model.describe()["generated-token layers"] == "aotinductor"
    agree = (eager.argmax(-1) == ahead.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree
    assert (eager - ahead).abs().max().item() < 1.5


def test_a_draft_runs_its_generated_tokens_ahead_of_time(reference, monkeypatch):
    """A draft (compiled=False, ahead_of_time=True): its generated tokens' layers are the
    AOTInductor artifact (no Dynamo, no torch.compile graphs beside the target's), its
    prompts eager; the eager tokens. LOCALCHAT_EAGER=1 keeps it all eager."""
    weights, tokens, eager = reference
    monkeypatch.setenv("LOCALCHAT_EAGER", "1")
    still_eager = LlamaModel(weights, 256, compiled=False, ahead_of_time=True)
    teacher_forced(still_eager, tokens[:66], 64, warm=True)
    assert still_eager.describe()["generated-token layers"] == "eager"
    monkeypatch.setenv("LOCALCHAT_EAGER", "0")
    draft = LlamaModel(weights, 256, compiled=False, ahead_of_time=True)
    ahead = teacher_forced(draft, tokens, 64, warm=True)
    assert draft.describe()["generated-token layers"] == "aotinductor"
    assert not draft.steps.compiled
    assert torch.equal(eager[:64], ahead[:64])  # the prompt ran eagerly
    agree = (eager.argmax(-1) == ahead.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree
    assert (eager - ahead).abs().max().item() < 1.5


@pytest.mark.model
def test_eager_on_request_and_reported(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("LOCALCHAT_EAGER", "1")
    assert not compiles_by_default(cpu)
    monkeypatch.setenv("LOCALCHAT_EAGER", "0")
    assert compiles_by_default(cpu)  # the image has g++
    assert not compiles_by_default(torch.device("mps"))
    weights = load_weights(resolve_model_facts("default").path)
    assert LlamaModel(weights, 64, compiled=True).describe() == {
        "generated-token layers": "inductor"}  # no KV store yet
    assert LlamaModel(weights, 64, compiled=False).describe() == {
        "generated-token layers": "eager"}


def test_a_damaged_artifact_is_refused_by_the_loader(tmp_path):
    from localchat.engine.executors.torch import aot_layer

    damaged = tmp_path / "decode-layer-x.pt2"
    damaged.write_bytes(b"PK\x03\x04 not a package")
    try:
        aot_layer._load(damaged)
    except Exception:  # noqa: BLE001 -- load_decode_layer rebuilds on any failure
        return
    raise AssertionError("a damaged artifact loaded")
