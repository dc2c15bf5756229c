"""What a draft learns from: the target's greedy replies to chat prompts (or saved conversations, or
a text file), each position labelled with the target's top-k next-token log-probabilities. The
built-in prompts never overlap the text `localchat eval` scores."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from localchat.engine.base import Message
from localchat.engine.runtime.executor_api import Chunk
from localchat.storage.conversations import ConversationStore

TOP_K = 32
TEMPLATES = (
    "Explain {} to a beginner.", "Write a short story about {}.", "What are the pros and cons of {}?",
    "Give me three practical tips about {}.", "Write a poem about {}.", "Summarize the history of {}.",
    "How would you teach a child about {}?", "Write an email to a friend about {}.",
    "What are common mistakes people make with {}?", "Describe {} in detail.",
    "Compare {} with something similar and explain the differences.", "Write a blog post about {}.",
    "Write a short dialogue between two people about {}.", "Explain {} using an analogy.",
    "Give a step-by-step guide to getting started with {}.",
    "List five questions people often ask about {} and answer each briefly.",
    "What should a student know about {}?", "Write a product description for something to do with {}.",
    "What is the most surprising fact about {}, and why?", "Write a speech about {}.",
)
SUBJECTS = (
    "photosynthesis", "the French revolution", "a hash table", "learning to cook", "black holes",
    "saving money", "a lighthouse keeper", "machine learning", "the water cycle", "volcanoes",
    "sorting algorithms", "running a marathon", "climate change", "the stock market", "gardening",
    "a lost dog finding its way home", "the human heart", "recursion in programming", "coffee",
    "remote work", "the moon landing", "vaccines", "a robot who wants to paint", "chess openings",
    "public speaking", "the Roman empire", "electric cars", "sleep", "time management", "bees",
    "SQL databases", "the internet", "a dragon and a knight", "healthy breakfast", "rainbows",
    "writing a resume", "ancient Egypt", "git branches", "friendship", "the ocean",
    "the solar system", "baking bread", "binary search", "the immune system", "a haunted house",
    "learning a new language", "the printing press", "renewable energy", "a cat who learns to fly",
    "Python decorators", "meditation", "the Great Wall of China", "budget travel", "earthquakes",
    "linked lists", "a detective solving a mystery", "coral reefs", "the Renaissance",
    "job interviews", "3D printing", "the speed of light", "composting", "a first day at school",
    "HTTP requests", "dinosaurs", "teamwork", "inflation", "the periodic table", "knitting",
    "a spaceship crew far from home", "unit testing", "bird migration", "Shakespeare",
    "smartphones", "the Olympic games", "regular expressions",
)


def chat_prompts(seed: int = 0) -> list[str]:
    """Every template × subject, in a fixed shuffled order."""
    prompts = [t.format(s) for t, s in itertools.product(TEMPLATES, SUBJECTS)]
    random.Random(seed).shuffle(prompts)
    return prompts


@dataclass
class Example:
    """A token sequence with the target's top-k log-probs for the token after each of
    its positions."""

    tokens: torch.Tensor  # [T] int64
    top_ids: torch.Tensor  # [T, k] int32
    top_logp: torch.Tensor  # [T, k] float16

    @property
    def n_labels(self) -> int:
        return int(self.top_ids.shape[0])


def _top(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logp, ids = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)
    return ids.to(torch.int32), logp.to(torch.float16)


def teacher_replies(executor, template: str | None, prompts: Iterable[str], max_new: int,
                    budget_tokens: int,
                    on_tokens: Callable[[int], None] = lambda n: None,
                    parallel: int = 16, k: int = TOP_K) -> list[Example]:
    """The target's greedy reply to each prompt (chat template applied), batched
    `parallel` at a time, until `budget_tokens` labelled positions are collected (the
    replies under way then are kept as far as they got)."""
    vocab = executor.vocab
    pending = iter(prompts)
    slots: dict[int, dict] = {}
    done: list[Example] = []
    collected = 0

    def start(slot: int) -> dict | None:
        prompt = next(pending, None)
        if prompt is None:
            return None
        return {"tokens": vocab.tokenize_messages(template, [Message("user", prompt)]),
                "ids": [], "logp": [], "computed": 0, "new": 0}

    def finish(state: dict) -> None:
        if state["ids"]:
            ids = torch.cat(state["ids"])
            done.append(Example(torch.tensor(state["tokens"][:ids.shape[0]]), ids,
                                torch.cat(state["logp"])))

    for slot in range(parallel):
        if (state := start(slot)) is not None:
            slots[slot] = state
    while slots and collected < budget_tokens:
        chunks = [Chunk(slot=s, tokens=st["tokens"][st["computed"]:], start=st["computed"],
                        n_logits=len(st["tokens"]) - st["computed"], block_table=[],
                        write_from=st["computed"], n_prompt=len(st["tokens"]))
                  for s, st in slots.items()]
        logits = torch.from_numpy(executor.forward(chunks))
        row = 0
        for chunk in chunks:
            st = slots[chunk.slot]
            part = logits[row:row + chunk.n_logits]
            row += chunk.n_logits
            ids, logp = _top(part, k)
            st["ids"].append(ids)
            st["logp"].append(logp)
            st["computed"] = len(st["tokens"])
            token = int(ids[-1, 0])
            collected += chunk.n_logits
            on_tokens(chunk.n_logits)
            if vocab.is_end_of_generation(token) or st["new"] >= max_new:
                finish(st)
                state = start(chunk.slot)
                if state is None:
                    del slots[chunk.slot]
                else:
                    slots[chunk.slot] = state
            else:
                st["tokens"].append(token)
                st["new"] += 1
    for st in slots.values():
        finish(st)
    return done


def teacher_labels(executor, sequences: Iterable[list[int]], budget_tokens: int,
                   on_tokens: Callable[[int], None] = lambda n: None, window: int = 512,
                   k: int = TOP_K) -> list[Example]:
    """Top-k labels for given token sequences (conversations, text), in windows of
    `window` tokens, until `budget_tokens` labelled positions are collected."""
    out: list[Example] = []
    collected = 0
    for seq in sequences:
        for start in range(0, len(seq), window):
            piece = seq[start:start + window]
            if len(piece) < 2 or collected >= budget_tokens:
                continue
            logits = torch.from_numpy(executor.forward([Chunk(
                slot=0, tokens=piece, start=0, n_logits=len(piece), block_table=[], write_from=0,
                n_prompt=len(piece))]))
            ids, logp = _top(logits, k)
            out.append(Example(torch.tensor(piece), ids, logp))
            collected += len(piece)
            on_tokens(len(piece))
    return out


def conversation_messages(limit: int = 500) -> list[list[Message]]:
    """Each stored conversation's current branch (system prompt first), newest first;
    empty and unfinished replies are left out."""
    store = ConversationStore.open()
    try:
        out = []
        for conversation in store.list_conversations()[:limit]:
            messages = [Message("system", conversation.system_prompt)] if conversation.system_prompt else []
            messages += [Message(m.role, m.content) for m in store.messages(conversation.id)
                         if m.role in ("user", "assistant") and m.content]
            if any(m.role == "assistant" for m in messages):
                out.append(messages)
        return out
    finally:
        store.close()
