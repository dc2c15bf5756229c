"""Does the torch engine compute what llama.cpp computes on one GGUF (`localchat eval
--agreement`)? Top-1 agreement, largest logit difference and greedy continuations, repeated on the
float32 dequantization to tell arithmetic apart from activation rounding."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from localchat.engine.base import Message, Request, SamplingParams
from localchat.models.facts import GGUFFacts
from localchat.models.files import validate_model_file

GREEDY_PROMPTS = (
    "Which city is the capital of France?",
    "Write a Python function that reverses a string.",
    "List three colours of the rainbow.",
    "Explain in one sentence why the sky is blue.",
    "What is 12 times 7?",
)
GREEDY_TOKENS = 32


def varied_text_tokens(vocab, n: int) -> list[int]:
    """≥ n tokens of English prose, grammar, code and unicode from Python's own docs
    (every Python ships them), always the same slice."""
    from pydoc_data.topics import topics

    tokens: list[int] = []
    for key in ("if", "for", "try", "class", "with", "lambda", "assert", "import", "def"):
        tokens += vocab.tokenize_text(topics[key] + " naïve café 東京 ✓ 😀\n")
        if len(tokens) >= n:
            return tokens[:n]
    raise ValueError(f"the reference text has only {len(tokens)} tokens, fewer than {n}")


@dataclass
class Comparison:
    a: str
    b: str
    positions: int
    top1_agreement: float
    max_logit_diff: float
    mean_logit_diff: float


@dataclass
class GreedyCheck:
    weights: str
    prompts: int
    identical: int
    first_divergence: list[int | None]  # token index per prompt, None when identical


@dataclass
class AgreementReport:
    model: str
    positions: int
    comparisons: list[Comparison] = field(default_factory=list)
    greedy: list[GreedyCheck] = field(default_factory=list)
    # per weights: the torch kernel each matrix ran on (chosen by speed on this machine; one
    # rounding activations unlike llama.cpp lowers agreement at near-ties)
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def table(self) -> str:
        lines = [f"Agreement on {self.model}: teacher-forced over {self.positions} positions "
                 f"of Python's docs; greedy {GREEDY_TOKENS} tokens from {len(GREEDY_PROMPTS)} prompts",
                 "", f"  {'compared':44s} {'top-1':>7s} {'max |Δlogit|':>13s} {'mean':>7s}"]
        for c in self.comparisons:
            lines.append(f"  {c.a + ' vs ' + c.b:44s} {c.top1_agreement:7.2%} "
                         f"{c.max_logit_diff:13.3f} {c.mean_logit_diff:7.4f}")
        lines.append("")
        for g in self.greedy:
            lines.append(f"  greedy, {g.weights} weights: {g.identical}/{g.prompts} identical"
                         + ("" if g.identical == g.prompts else
                            f" (first divergence at tokens {g.first_divergence})"))
        for weights, chosen in self.kernels.items():
            lines.append(f"  torch kernels, {weights} weights: " +
                         ", ".join(f"{layer} {kernel}" for layer, kernel in chosen.items()))
        return "\n".join(lines)


def _compare(a: str, b: str, la: torch.Tensor, lb: torch.Tensor) -> Comparison:
    return Comparison(a, b, positions=la.shape[0],
                      top1_agreement=(la.argmax(-1) == lb.argmax(-1)).float().mean().item(),
                      max_logit_diff=(la - lb).abs().max().item(),
                      mean_logit_diff=(la - lb).abs().mean().item())


def llama_cpp_logits(path, tokens: list[int], threads: int = 2) -> torch.Tensor:
    """llama.cpp's logits at every position of one prompt pass over `tokens`."""
    import localchat.engine.executors.llama_lib  # noqa: F401 -- the CPU check before libllama
    from llama_cpp import Llama

    from localchat.engine.executors import llamacpp_vocab  # noqa: F401  (keeps llama.cpp's log off the terminal)
    from localchat.engine.executors.llamacpp_backends import load_cpu_backend

    load_cpu_backend()  # a GGML_BACKEND_DL build registers no CPU backend of its own

    llm = Llama(str(path), n_ctx=len(tokens), n_batch=512, logits_all=True,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        llm.eval(tokens)
        return torch.from_numpy(np.array(llm.scores[:len(tokens)], dtype=np.float32))
    finally:
        llm.close()


def torch_logits(weights, tokens: list[int]) -> torch.Tensor:
    """The torch model's logits at every position of one prefill over `tokens`, through a KV
    store of its own (not an engine's pool)."""
    from localchat.engine.executors.torch.executor import KV_DTYPE
    from localchat.engine.executors.torch.model import KVStore, LlamaModel

    n = len(tokens)
    model = LlamaModel(weights, max_positions=n)
    kv = KVStore(model.config, n, dtype=KV_DTYPE, device=model.device)
    return model.forward(torch.tensor(tokens), torch.arange(n), torch.arange(n), torch.arange(n),
                         kv, all_logits=True)


def _greedy_tokens(engine, prompt: str) -> list[int]:
    request = Request(messages=[Message("user", prompt)], max_tokens=GREEDY_TOKENS,
                      sampling=SamplingParams(temperature=0.0, seed=0))
    tokens: list[int] = []
    for event in engine.generate(request):
        tokens += getattr(event, "token_ids", ())
    return tokens


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _measure_file(facts: GGUFFacts, label: str, n: int, threads: int, report: AgreementReport,
                  tokens: list[int] | None) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    from localchat.engine import open_engine
    from localchat.engine.config import NO_DRAFT, EngineConfig

    # one sequence, and the f16 cache the torch executor keeps: only the models differ
    config = EngineConfig(str(facts.path), engine="llama.cpp", ctx_size=n + 64,
                          threads=threads, parallel=1, draft=NO_DRAFT, kv_disk=0,
                          cache_type_k="f16", cache_type_v="f16", flash_attn=False)
    llama_engine = open_engine(config)
    torch_engine = open_engine(replace(config, engine="torch", cache_type_k=None,
                                       cache_type_v=None, flash_attn=True))
    try:
        tokens = tokens or varied_text_tokens(torch_engine, n)
        report.kernels[label] = dict(torch_engine.info.kernels)
        ours = torch_logits(torch_engine.executor.model.w, tokens)
        theirs = llama_cpp_logits(facts.path, tokens, threads)
        report.comparisons.append(_compare(f"torch {label}", f"llama.cpp {label}", ours, theirs))
        divergences = [_first_divergence(_greedy_tokens(torch_engine, p), _greedy_tokens(llama_engine, p))
                       for p in GREEDY_PROMPTS]
        report.greedy.append(GreedyCheck(label, len(GREEDY_PROMPTS),
                                         sum(d is None for d in divergences), divergences))
        return tokens, ours, theirs
    finally:
        torch_engine.close()
        llama_engine.close()


def measure_agreement(path: str | Path, *, positions: int = 1100, threads: int = 2,
                      with_float32: bool = True) -> AgreementReport:
    facts = validate_model_file(path)
    report = AgreementReport(model=Path(facts.path).name, positions=positions)
    tokens, ours_q, theirs_q = _measure_file(facts, facts.quant_type, positions, threads, report, None)
    if with_float32 and facts.quant_type != "F32":
        from quantize.gguf_convert import dequantize_gguf

        with tempfile.TemporaryDirectory(prefix="localchat-agreement-") as tmp:
            f32 = validate_model_file(dequantize_gguf(facts.path, Path(tmp) / "float32.gguf"))
            _, ours_f, theirs_f = _measure_file(f32, "F32", positions, threads, report, tokens)
        report.comparisons += [
            _compare(f"llama.cpp {facts.quant_type}", "llama.cpp F32", theirs_q, theirs_f),
            _compare(f"torch {facts.quant_type}", "torch F32", ours_q, ours_f),
        ]
    return report
