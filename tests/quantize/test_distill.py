"""`localchat distill` on the real bundled model: the student's torch forward is the
target's when it keeps every layer, a cut-down student written as GGUF runs in llama.cpp
as it ran in torch, training lowers the distillation loss, and the command writes a
draft (atomically), resumes, and refuses bad arguments in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from localchat.engine.runtime.executor_api import Chunk
from localchat.engine.executors.llamacpp import LlamaCppExecutor
from localchat.models.files import validate_model_file
from localchat.models.specs import resolve_model
from localchat.engine.choice import default_threads
from quantize.distill import _batch, agreement, file_agreement, kd_loss
from quantize.distill_data import chat_prompts, teacher_replies
from quantize.student import default_layers, student_from_target, write_student_gguf

from helpers.cli import localchat

TARGET = Path(resolve_model("default"))


@pytest.fixture(scope="module")
def replies():
    """The target's greedy replies to four prompts, with its top-k labels."""
    facts = validate_model_file(TARGET)
    executor = LlamaCppExecutor(facts, n_ctx=512, threads=default_threads(), parallel=4)
    try:
        return teacher_replies(executor, facts.chat_template, chat_prompts()[:4], 24, 10_000,
                               parallel=4)
    finally:
        executor.close()


@pytest.mark.model
def test_teacher_replies_label_every_position_with_the_targets_argmax(replies):
    assert len(replies) == 4
    for e in replies:
        assert e.top_ids.shape == (len(e.tokens), 32) and e.top_logp.shape == e.top_ids.shape
        # greedy: each generated token is the target's argmax at the position before it
        assert torch.equal(e.tokens[-23:], e.top_ids[-24:-1, 0].long())
        assert (e.top_logp[:, :-1] >= e.top_logp[:, 1:]).all()  # sorted, most likely first


@pytest.mark.model
def test_a_student_with_every_layer_is_the_target(replies):
    student = student_from_target(TARGET, list(range(30)))
    with torch.no_grad():
        hits = [float((student(e.tokens[None])[0].argmax(-1) == e.top_ids[:, 0].long()).float().mean())
                for e in replies]
    assert min(hits) > 0.9, hits  # float32 torch vs llama.cpp's Q4_1 kernels


@pytest.mark.model
def test_the_default_cut_drops_the_middle_layers_which_keeps_the_target_s_answers(replies):
    """Untrained, 16 of 30 layers: the first 8 and last 8 still agree with the target
    somewhat; the first 15 and the last (the old cut) agree nowhere (docs/benchmarks.md)."""
    assert default_layers(30, 16) == list(range(8)) + list(range(22, 30))
    assert default_layers(30, 1) == [29] and default_layers(30, 3) == [0, 1, 29]
    kept = agreement(student_from_target(TARGET, default_layers(30, 16)), replies)
    old = agreement(student_from_target(TARGET, list(range(15)) + [29]), replies)
    assert kept > old + 0.05, (kept, old)


@pytest.mark.model
def test_a_cut_student_runs_in_llama_cpp_as_in_torch(replies, tmp_path):
    student = student_from_target(TARGET, default_layers(30, 2))
    assert student.source_layers == [0, 29]
    out = write_student_gguf(student, TARGET, tmp_path / "draft.gguf")
    facts = validate_model_file(out)
    assert facts.n_layers == 2 and facts.chat_template and facts.quant_type == "Q8_0"
    tokens = replies[0].tokens
    with torch.no_grad():
        ours = student(tokens[None])[0]
    same = float((ours.argmax(-1) == _llama_cpp_logits(out, tokens).argmax(-1)).float().mean())
    assert same > 0.9, same  # Q8_0 layers in the file


@pytest.mark.model
def test_a_student_trained_as_q4_1_is_what_llama_cpp_runs_from_the_q4_1_file(replies, tmp_path):
    """Quantization-aware: with its weights moved off the target's 4-bit grid (as training
    moves them), the student's Q4_1-aware forward matches the written Q4_1 file much more
    closely than its float32 forward does."""
    torch.manual_seed(0)
    student = student_from_target(TARGET, default_layers(30, 2))
    with torch.no_grad():
        for block in student.blocks:
            for w in block.w.values():
                if w.ndim == 2:
                    w.add_(torch.randn_like(w) * w.std() * 0.3)
    out = write_student_gguf(student, TARGET, tmp_path / "draft.gguf", Q.Q4_1)
    assert validate_model_file(out).quant_type == "Q4_1"
    tokens = replies[0].tokens
    theirs = torch.log_softmax(_llama_cpp_logits(out, tokens), -1)
    with torch.no_grad():
        as_float = torch.log_softmax(student(tokens[None])[0], -1)
        student.train_as(Q.Q4_1)
        aware = torch.log_softmax(student(tokens[None])[0], -1)
    float_error = float((as_float - theirs).abs().mean())
    aware_error = float((aware - theirs).abs().mean())
    assert aware_error < 0.3 * float_error, (aware_error, float_error)


def _llama_cpp_logits(model: Path, tokens: torch.Tensor) -> torch.Tensor:
    executor = LlamaCppExecutor(validate_model_file(model), n_ctx=256, threads=default_threads(),
                                parallel=1)
    try:
        return torch.from_numpy(executor.forward([Chunk(
            slot=0, tokens=tokens.tolist(), start=0, n_logits=len(tokens), block_table=[],
            write_from=0, n_prompt=len(tokens))]))
    finally:
        executor.close()


@pytest.mark.model
def test_training_steps_lower_the_loss(replies):
    torch.manual_seed(0)
    student = student_from_target(TARGET, default_layers(30, 2))
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4)
    tokens, ids, logp, mask = _batch(replies)
    losses = []
    for _ in range(6):
        loss = kd_loss(student(tokens), ids, logp, mask, 1.0, 0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0], losses


def test_kd_loss_is_smallest_when_the_student_copies_the_teacher():
    teacher = torch.randn(1, 3, 50)
    logp, ids = torch.log_softmax(teacher, -1).topk(50, dim=-1)
    mask = torch.ones(1, 3)
    same = kd_loss(teacher, ids.int(), logp.half(), mask, 2.0, 0.0)
    other = kd_loss(torch.randn(1, 3, 50), ids.int(), logp.half(), mask, 2.0, 0.0)
    assert same < other


@pytest.mark.subprocess
@pytest.mark.slow
def test_distill_command_writes_a_draft_that_auto_then_uses_and_resumes(tmp_path):
    home = tmp_path / "home"
    at_home = {"env_extra": {"LOCALCHAT_HOME": str(home)}, "timeout": 900}
    tiny = ("--layers", "2", "--steps", "2", "--teacher-tokens", "1000", "--threads", "2")
    done = localchat("distill", "default", *tiny, "--json", **at_home)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    draft = Path(result["out"])
    assert draft.parent == home / "drafts" and draft.is_file() and result["steps"] == 2
    assert (draft.parent / (draft.name + ".distill") / "state.pt").is_file()
    # the chat's default draft (auto) is now this file
    run = localchat("run", "--temp", "0", "-n", "8", "--json", "Say hi.", **at_home)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["draft"]["source"].startswith("ngram+model:"), run.stdout
    # an existing draft is not replaced without --force; --resume continues its steps
    again = localchat("distill", "default", *tiny, **at_home)
    assert again.returncode == 2 and "already exists" in again.stderr
    resumed = localchat("distill", "default", "--resume", "--steps", "3", "--json", **at_home)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["steps"] == 3
    # a new run with other training options reuses the labels; --layer-type Q4_1 writes 4 bits
    four_bit = localchat("distill", "default", *tiny, "--force", "--layer-type", "Q4_1", **at_home)
    assert four_bit.returncode == 0, four_bit.stderr
    assert "target labels: reusing" in four_bit.stderr, four_bit.stderr
    assert validate_model_file(draft).quant_type == "Q4_1"


@pytest.mark.subprocess
def test_distill_argument_errors_are_one_line(tmp_path):
    for args in (("distill", "default", "--layers", "30"),
                 ("distill", "default", "--resume", "-o", str(tmp_path / "none.gguf")),
                 ("distill", str(tmp_path / "missing.gguf"))):
        done = localchat(*args)
        assert done.returncode != 0 and done.stderr.startswith("localchat: error:"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.model
def test_file_agreement_of_the_target_itself_is_high(replies, tmp_path):
    assert file_agreement(TARGET, replies[:2], threads=default_threads()) > 0.95
