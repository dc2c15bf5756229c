"""`localchat plan`: "does it fit?" is the wrong question; the planner answers "with how
much context, for how many users?" from a model's metadata alone.

Weights bytes are the file's tensor bytes (what llama.cpp reports as the model size)
and, for other quant types, parameters × bits per weight. KV bytes per token are
2 · layers · kv_heads · head_dim · bytes per value, per KV-cache type; the engines use
the same formula (tests check that they agree).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from localchat.errors import UsageError
from localchat.models.facts import DEFAULT_CTX
from localchat.models.facts import GGUFFacts
from localchat.models.gguf_reader import read_gguf
from localchat.models.specs import resolve_model_facts
from localchat.units import human_bytes, machine_memory, parse_memory

# bits per weight of llama.cpp's types (block bytes × 8 / block size; K-quant mixes averaged)
BITS_PER_WEIGHT = {"F16": 16.0, "Q8_0": 8.5, "Q6_K": 6.5625, "Q5_K_M": 5.69, "Q5_1": 6.0,
                   "Q5_0": 5.5, "Q4_K_M": 4.85, "Q4_1": 5.0, "Q4_0": 4.5, "NF4": 4.127}
# bytes per cached value, by KV-cache type (llama.cpp's -ctk/-ctv names; "q8_0/f16" is
# K as q8_0 and V as f16, the llama.cpp executor's cache on the CPU, averaged per value)
KV_BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0/f16": (34 / 32 + 2) / 2, "q8_0": 34 / 32,
                      "q4_0": 18 / 32}
@dataclass(frozen=True)
class ModelSize:
    weights_bytes: int  # as stored in the file
    n_params: int
    facts: GGUFFacts

    def kv_bytes_per_token(self, kv_type: str = "f16") -> int:
        return self.facts.kv_bytes_per_token(KV_BYTES_PER_VALUE[kv_type])

    def weights_bytes_as(self, quant: str) -> int:
        if quant == self.facts.quant_type:
            return self.weights_bytes
        return round(self.n_params * BITS_PER_WEIGHT[quant] / 8)


def model_size(facts: GGUFFacts) -> ModelSize:
    if facts.path.is_dir():  # a Hugging Face directory: its safetensors headers
        from localchat.models.hf_files import tensor_totals

        return ModelSize(*tensor_totals(facts.path), facts)
    with read_gguf(facts.path) as f:
        tensors = list(f.tensors.values())
    return ModelSize(sum(t.n_bytes for t in tensors), sum(t.n_elements for t in tensors), facts)


def context_that_fits(size: ModelSize, memory: int, kv_type: str) -> int:
    """Tokens of KV cache that fit beside the weights (0 if the weights alone do not)."""
    return max(0, (memory - size.weights_bytes) // size.kv_bytes_per_token(kv_type))


def build_plan(size: ModelSize, budgets: list[int], ctx: int) -> dict:
    f = size.facts
    return {
        "model": f.name, "quant": f.quant_type, "params": size.n_params,
        "weights_bytes": size.weights_bytes, "context": ctx, "model_context": f.context_length,
        "weights_bytes_by_quant": {q: size.weights_bytes_as(q) for q in BITS_PER_WEIGHT},
        "kv_bytes_per_token": {k: size.kv_bytes_per_token(k) for k in KV_BYTES_PER_VALUE},
        "budgets": [
            {"memory_bytes": m,
             "kv": {k: {"tokens": (t := context_that_fits(size, m, k)), "users_at_context": t // ctx}
                    for k in KV_BYTES_PER_VALUE}}
            for m in budgets
        ],
    }


def format_plan(plan: dict) -> str:
    lines = [f"{plan['model']} ({plan['quant']}): {plan['params'] / 1e6:.0f}M parameters, "
             f"weights {human_bytes(plan['weights_bytes'])}",
             "weights if quantized as: " + ", ".join(
                 f"{q} {human_bytes(b)}" for q, b in plan["weights_bytes_by_quant"].items()),
             "KV per token: " + ", ".join(
                 f"{k} {human_bytes(b)}" for k, b in plan["kv_bytes_per_token"].items()),
             "",
             f"{'memory':>10}  {'KV type':<7} {'KV tokens that fit':>24}  "
             f"{'users at ' + str(plan['context']) + ' tokens':>20}"]
    for budget in plan["budgets"]:
        for kv_type, fit in budget["kv"].items():
            lines.append(f"{human_bytes(budget['memory_bytes']):>10}  {kv_type:<8} "
                         f"{fit['tokens']:>24,}  {fit['users_at_context']:>20,}")
    lines.append(f"(weights + KV cache only; one chat's context is capped at the model's "
                 f"{plan['model_context']:,} tokens; compute buffers are extra)")
    return "\n".join(lines)


def add_parser(sub) -> None:
    plan = sub.add_parser("plan", help="how much context, for how many users, fits in memory",
                          description="Memory plan from a model's metadata: weights, KV per "
                                      "token, and the context and users a budget allows.")
    plan.add_argument("-m", "--model", default="default", metavar="SPEC")
    plan.add_argument("--memory", default=None, metavar="SIZE[,SIZE...]",
                      help="memory budgets, e.g. 8GB or 8GB,16GB (default: this machine's RAM)")
    plan.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                      help="context per user (default: 4096)")
    plan.add_argument("--json", action="store_true", help="print JSON")
    plan.set_defaults(handler=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    budgets = ([parse_memory(m) for m in args.memory.split(",")] if args.memory
               else [machine_memory()])
    ctx = args.ctx_size or DEFAULT_CTX
    if ctx < 1:
        raise UsageError(f"context size must be >= 1, got {ctx}")
    plan = build_plan(model_size(resolve_model_facts(args.model)), budgets, ctx)
    print(json.dumps(plan) if args.json else format_plan(plan))
    return 0
