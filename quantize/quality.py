"""How a model's next-token distributions compare with a reference's on held-out text:
perplexity (with its 95 % interval), KL, top-1 agreement and α, teacher-forced over sliding
windows that score every token once; each report states the protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from localchat.engine.runtime.speculative.adaptive import expected_speedup
from localchat.errors import UsageError

AGREEMENT_KEYS = ("if", "for", "try", "class", "with", "lambda", "assert", "import", "def")


def default_text() -> str:
    """Python's own documentation (pydoc_data.topics, which every Python ships), minus
    the topics `eval --agreement` uses, in sorted key order: always the same text."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics) if k not in AGREEMENT_KEYS)


def text_tokens(vocab, n: int, text_file: str | None = None) -> list[int]:
    """The first n tokens of the text (reading only as much as it needs)."""
    if text_file is not None:
        try:
            text = Path(text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read --text {text_file}: {e}") from None
    else:
        text = default_text()
    tokens: list[int] = []
    for start in range(0, len(text), 20000):
        tokens += vocab.tokenize_text(text[start:start + 20000])
        if len(tokens) >= n:
            return tokens[:n]
    raise UsageError(f"the text has {len(tokens)} tokens; {n} are needed (lower --tokens)")


def windows(n_scored: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first scored index in the window) per window."""
    if not 0 < stride < window or n_scored < 1:
        raise UsageError(f"need 0 < stride < window and tokens > 0 (window {window}, "
                         f"stride {stride}, tokens {n_scored})")
    end = min(window, n_scored + 1)
    spans, scored = [(0, end, 1)], end - 1
    while scored < n_scored:
        new = min(stride, n_scored - scored)  # a short last step: a shorter window
        end += new
        spans.append((end - (window - stride) - new, end, window - stride))
        scored += new
    return spans


def scored_logprobs(weights, tokens: list[int], spans) -> torch.Tensor:
    """[n_scored, vocab] log-probabilities of the next token at every scored position."""
    from localchat.engine.executors.torch.model import KVStore, LlamaModel

    window = max(end - start for start, end, _ in spans)
    model = LlamaModel(weights, max_positions=window)
    kv = KVStore(model.config, window, device=model.device)
    out = []
    for start, end, first in spans:
        n = end - start
        idx = torch.arange(n)
        logits = model.forward(torch.tensor(tokens[start:end]), idx, idx, idx, kv, all_logits=True)
        out.append(torch.log_softmax(logits[first - 1:n - 1].float(), dim=-1))
    return torch.cat(out)


def targets(tokens: list[int], spans) -> torch.Tensor:
    return torch.tensor([t for start, end, first in spans for t in tokens[start + first:end]])


def perplexity(logprobs: torch.Tensor, target: torch.Tensor) -> dict:
    nll = -logprobs.gather(1, target[:, None])[:, 0].double()
    mean, sem = nll.mean().item(), (nll.std().item() / math.sqrt(nll.numel()))
    return {"perplexity": math.exp(mean), "perplexity_ci95": [math.exp(mean - 1.96 * sem),
                                                            math.exp(mean + 1.96 * sem)],
            "mean_nll": mean}


def compare(ref: torch.Tensor, model: torch.Tensor, target: torch.Tensor, *,
            gamma: int = 4, cost_ratio: float = 0.3) -> dict:
    """Perplexity of `model`, and its distributions against the reference's."""
    kl, agree, alpha = [], [], []
    for a, b in zip(ref.split(256), model.split(256)):  # bounded temporaries
        p, q = a.exp(), b.exp()
        kl.append((p * (a - b)).sum(-1))
        agree.append(a.argmax(-1) == b.argmax(-1))
        alpha.append(torch.minimum(p, q).sum(-1))
    a = torch.cat(alpha).double().mean().item()
    return perplexity(model, target) | {
        "kl_divergence": torch.cat(kl).double().mean().item(),
        "agreement": torch.cat(agree).float().mean().item(),
        "alpha": a,
        "predicted_speedup": expected_speedup(a, gamma, cost_ratio),
    }


@dataclass
class Protocol:
    tokens: int
    window: int
    stride: int
    text: str
    gamma: int
    cost_ratio: float

    def describe(self) -> str:
        return (f"{self.tokens} scored tokens of {self.text}; windows of {self.window} tokens, "
                f"stride {self.stride} (each scored token sees ≥ {self.window - self.stride} "
                f"tokens of context; none is scored twice); teacher-forced, torch forward, "
                f"float32 KV; α at temperature 1, speedup at γ = {self.gamma}, "
                f"c = {self.cost_ratio}")

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "window": self.window, "stride": self.stride,
                "text": self.text, "gamma": self.gamma, "cost_ratio": self.cost_ratio}
