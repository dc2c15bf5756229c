"""`localchat distill TARGET -o DRAFT.gguf`: a small draft cut from the target, trained to match its
next-token distributions. State lives in `DRAFT.gguf.distill/` beside the output (Ctrl+C saves,
`--resume` continues); the GGUF is written atomically when training ends."""

from __future__ import annotations

import hashlib
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as Q

from localchat.errors import UsageError
from quantize.distill_data import (Example, chat_prompts, conversation_messages, teacher_labels,
                                   teacher_replies)
from quantize.progress import Progress, clock
from quantize.safe_output import atomic_output_file
from quantize.self_prompts import self_prompts
from quantize.student import Student, default_layers, student_from_target, write_student_gguf
from localchat.engine.choice import default_threads

LAYER_TYPES = {"Q8_0": Q.Q8_0, "Q4_1": Q.Q4_1, "Q4_0": Q.Q4_0}

HELD_OUT = 24  # examples kept out of training to measure α at the end


@dataclass
class DistillOptions:
    layers: int = 4
    steps: int = 240
    temperature: float = 1.0
    hard_weight: float = 0.0  # weight of the target's argmax as a hard label
    lr: float = 5e-4
    batch: int = 8  # examples per step
    teacher_tokens: int = 80_000  # labelled positions to collect from the target
    max_new: int = 256  # tokens per teacher reply
    history: bool = False  # also learn from the user's saved conversations
    text_file: str | None = None  # also learn from this text
    threads: int | None = None
    seed: int = 0
    layer_type: str = "Q8_0"  # the draft's layer matrices; 4-bit types train quantization-aware
    prompts: str = "builtin"  # "self": the target writes the prompts it answers (self_prompts.py)


ESTIMATE_AFTER = 3  # training steps timed before the time left is said

def kd_loss(logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor,
            mask: torch.Tensor, temperature: float, hard_weight: float) -> torch.Tensor:
    """Cross-entropy of the student's tempered distribution against the target's
    (renormalised over its top-k), × T², plus hard_weight × CE on the target's argmax."""
    logq = torch.log_softmax(logits / temperature, -1).gather(-1, top_ids.long())
    p = torch.softmax(top_logp.float() / temperature, -1)
    loss = -(p * logq).sum(-1) * temperature ** 2
    if hard_weight:
        hard = torch.log_softmax(logits, -1).gather(-1, top_ids[..., :1].long())[..., 0]
        loss = loss - hard_weight * hard
    return (loss * mask).sum() / mask.sum()


def _batch(examples: list[Example]) -> tuple[torch.Tensor, ...]:
    t = max(len(e.tokens) for e in examples)
    k = examples[0].top_ids.shape[1]
    tokens = torch.zeros(len(examples), t, dtype=torch.long)
    ids = torch.zeros(len(examples), t, k, dtype=torch.int32)
    logp = torch.full((len(examples), t, k), -30.0, dtype=torch.float16)
    mask = torch.zeros(len(examples), t)
    for i, e in enumerate(examples):
        n = len(e.tokens)
        tokens[i, :n], ids[i, :n], logp[i, :n], mask[i, :n] = e.tokens, e.top_ids, e.top_logp, 1
    return tokens, ids, logp, mask


def agreement(student: Student, examples: list[Example]) -> float:
    """Share of positions where the student's argmax is the target's: α at T = 0."""
    hit = total = 0
    with torch.no_grad():
        for e in examples:
            guess = student(e.tokens[None])[0].argmax(-1)
            hit += int((guess == e.top_ids[:, 0].long()).sum())
            total += len(e.tokens)
    return hit / max(total, 1)


def file_agreement(draft: Path, examples: list[Example], threads: int | None) -> float:
    """agreement() of the written draft file as llama.cpp runs it (which also proves
    that llama.cpp loads it)."""
    from localchat.engine.runtime.executor_api import Chunk
    from localchat.engine.executors.llamacpp import LlamaCppExecutor
    from localchat.models.files import validate_model_file

    n_ctx = max(len(e.tokens) for e in examples)
    executor = LlamaCppExecutor(validate_model_file(draft), n_ctx=n_ctx,
                                threads=threads or default_threads(), parallel=1)
    hit = total = 0
    try:
        for e in examples:
            n = len(e.tokens)
            logits = torch.from_numpy(executor.forward([Chunk(
                slot=0, tokens=e.tokens.tolist(), start=0, n_logits=n, block_table=[],
                write_from=0, n_prompt=n)]))
            hit += int((logits.argmax(-1) == e.top_ids[:, 0].long()).sum())
            total += n
    finally:
        executor.close()
    return hit / max(total, 1)


class Workdir:
    """DRAFT.gguf.distill/: teacher.pt (labels), state.pt (student + optimizer + step)."""

    def __init__(self, out: Path) -> None:
        self.path = out.with_name(out.name + ".distill")

    def save(self, name: str, obj) -> None:
        self.path.mkdir(exist_ok=True)
        tmp = self.path / f".{name}.tmp"
        torch.save(obj, tmp)
        os.replace(tmp, self.path / name)

    def load(self, name: str):
        file = self.path / name
        return torch.load(file, weights_only=False) if file.exists() else None


def collect_teacher(target: Path, options: DistillOptions, log) -> list[Example]:
    """The target's greedy replies to the built-in (or its own) prompts, plus history/text
    if asked."""
    from localchat.engine.executors.llamacpp import LlamaCppExecutor
    from localchat.models.files import validate_model_file

    facts = validate_model_file(target)
    executor = LlamaCppExecutor(facts, n_ctx=1024, threads=options.threads or default_threads(),
                                parallel=16)
    try:
        extra = _extra_sequences(executor, facts, options)
        extra_budget = options.teacher_tokens // 3 if extra else 0
        t0 = time.perf_counter()
        prompts = _prompts(executor, facts, options)
        log(f"target labels: {options.teacher_tokens:,} positions from the target's replies "
            "(the bar says the time left)")
        bar = Progress("target labels", options.teacher_tokens)
        examples = teacher_labels(executor, extra, extra_budget, bar.advance) if extra else []
        got = sum(e.n_labels for e in examples)
        examples += teacher_replies(executor, facts.chat_template, prompts,
                                    options.max_new, options.teacher_tokens - got, bar.advance)
        bar.close()
        n = sum(e.n_labels for e in examples)
        log(f"target labels: {n} positions in {len(examples)} sequences, "
            f"{time.perf_counter() - t0:.0f} s")
        return examples
    finally:
        executor.close()


def _prompts(executor, facts, options: DistillOptions) -> list[str]:
    """The built-in prompts, or enough that the target writes itself for the label budget
    (a reply and its prompt average ~270 positions)."""
    if options.prompts == "builtin":
        return chat_prompts(options.seed)
    count = options.teacher_tokens // 200 + 16
    bar = Progress("target prompts", count)
    prompts = self_prompts(executor, facts.chat_template, count, options.seed,
                           on_prompt=bar.advance)
    bar.close()
    return prompts


def _extra_sequences(executor, facts, options: DistillOptions) -> list[list[int]]:
    sequences = []
    if options.text_file:
        try:
            text = Path(options.text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read --text {options.text_file}: {e}") from None
        sequences.append(executor.vocab.tokenize_text(text))
    if options.history:
        for messages in conversation_messages():
            sequences.append(executor.vocab.tokenize_messages(facts.chat_template, messages))
    return sequences


def distill(target: Path, out: Path, options: DistillOptions, resume: bool = False,
            log=lambda text: print(text, file=sys.stderr)) -> dict:
    """Train and write the draft; returns what was measured (α before/after, time)."""
    if options.threads:
        torch.set_num_threads(options.threads)
    work = Workdir(out)
    state = work.load("state.pt") if resume else None
    if resume and state is None:
        raise UsageError(f"nothing to resume: {work.path / 'state.pt'} does not exist")
    if state is not None:
        options = DistillOptions(**{**state["options"], "steps": options.steps})
    t_start = time.perf_counter()
    examples = _labels(work, target, options, resume, log)
    rng = random.Random(options.seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    n_held = min(HELD_OUT, len(examples) // 5)
    held_out = [examples[i] for i in order[:n_held]]
    train = [examples[i] for i in order[n_held:]]
    if not train:
        raise UsageError("too few target labels to train on (raise --teacher-tokens)")

    by_length = sorted(train, key=lambda e: len(e.tokens))
    batches = [by_length[i:i + options.batch] for i in range(0, len(by_length), options.batch)]
    rng.shuffle(batches)  # neighbours by length: little padding; batches in random order
    facts_layers = _target_layers(target)
    student = student_from_target(target, default_layers(facts_layers, options.layers))
    matrix_type = LAYER_TYPES[options.layer_type]
    student.train_as(None if matrix_type == Q.Q8_0 else matrix_type)
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad],
                                  lr=options.lr, weight_decay=0.0)
    step = 0
    if state is not None:
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    alpha_before = state["alpha_before"] if state else agreement(student, held_out)
    bf16 = student.use_bf16_head()
    log(f"draft: target layers {student.source_layers}; α on held-out replies {alpha_before:.3f}; "
        f"head in {'bfloat16' if bf16 else 'float32'} while training")

    def save_state() -> None:
        work.save("state.pt", {"student": student.state_dict(), "optimizer": optimizer.state_dict(),
                               "step": step, "options": asdict(options),
                               "alpha_before": alpha_before})

    bar = Progress("distilling", options.steps)
    bar.advance(step)
    first_step = step
    running = None
    last_save = time.perf_counter()
    try:
        while step < options.steps:
            lr = options.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / options.steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = batches[step % len(batches)]
            tokens, ids, logp, mask = _batch(batch)
            logits = student(tokens)
            loss = kd_loss(logits, ids, logp, mask, options.temperature, options.hard_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
            optimizer.step()
            step += 1
            with torch.no_grad():
                hit = ((logits.argmax(-1) == ids[..., 0].long()).float() * mask).sum() / mask.sum()
            running = float(hit) if running is None else 0.9 * running + 0.1 * float(hit)
            bar.advance(note=f"loss {float(loss.detach()):.3f} α≈{running:.2f}")
            if step - first_step == ESTIMATE_AFTER and bar.eta() is not None:
                log(f"training: {options.steps - step} more steps, about {clock(bar.eta())} "
                    "at this machine's pace")
            if time.perf_counter() - last_save > 60:
                save_state()
                last_save = time.perf_counter()
    except KeyboardInterrupt:
        bar.close()
        save_state()
        raise UsageError(f"interrupted at step {step} of {options.steps}; the state is in "
                         f"{work.path}: run again with --resume to continue") from None
    bar.close()
    save_state()
    with atomic_output_file(out) as tmp:
        write_student_gguf(student, target, tmp, matrix_type)
        alpha_after = file_agreement(tmp, held_out, options.threads)
    minutes = (time.perf_counter() - t_start) / 60
    log(f"wrote {out}: {options.layers} {options.layer_type} layers, α on held-out replies {alpha_before:.3f} -> "
        f"{alpha_after:.3f}, {minutes:.1f} min")
    return {"out": str(out), "layers": student.source_layers, "steps": step,
            "alpha_before": alpha_before, "alpha_after": alpha_after, "minutes": minutes}


def _labels(work: Workdir, target: Path, options: DistillOptions, resume: bool,
            log) -> list[Example]:
    """The target's labels: collected, or reused from the workdir when they came from this
    target file with the same label options (an earlier run, or the one being resumed)."""
    key = _labels_key(target, options)
    saved = work.load("teacher.pt")
    if isinstance(saved, dict) and (resume or (key is not None and saved.get("key") == key)):
        examples = saved["examples"]
        log(f"target labels: reusing {sum(e.n_labels for e in examples)} positions from "
            f"{work.path / 'teacher.pt'}")
        return examples
    if resume and isinstance(saved, list):  # written before labels had a key
        return saved
    examples = collect_teacher(target, options, log)
    work.save("teacher.pt", {"key": key, "examples": examples})
    return examples


def _labels_key(target: Path, options: DistillOptions) -> dict | None:
    """What the labels depend on; None (never reused) when they come from saved
    conversations, which change."""
    if options.history:
        return None
    try:
        stat = target.stat()
        text = Path(options.text_file).stat() if options.text_file else None
    except OSError:
        return None  # collecting them says what is wrong
    prompts = (hashlib.sha256("\n".join(chat_prompts(options.seed)).encode()).hexdigest()
               if options.prompts == "builtin" else f"self, seed {options.seed}")
    return {"target": str(target.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "text": [options.text_file, text.st_size, text.st_mtime_ns] if text else None,
            "teacher_tokens": options.teacher_tokens, "max_new": options.max_new,
            "prompts": prompts}


def _target_layers(target: Path) -> int:
    from localchat.models.files import validate_model_file

    facts = validate_model_file(target)
    return facts.n_layers
