"""`localchat plan`: how much context, for how many users, fits in memory; the numbers
come from models/planner.py, this module parses the arguments and prints them."""

from __future__ import annotations

import argparse
import json

from localchat.errors import UsageError
from localchat.models.facts import DEFAULT_CTX
from localchat.models.specs import resolve_model_facts
from localchat.units import human_bytes, machine_memory, parse_memory


def format_plan(plan: dict) -> str:
    from localchat.models.planner import PROJECTIONS_ONLY

    lines = [f"{plan['model']} ({plan['quant']}): {plan['params'] / 1e6:.0f}M parameters, "
             f"weights {human_bytes(plan['weights_bytes'])}",
             "weights if quantized as: " + ", ".join(
                 f"{q} {human_bytes(b)}" + (" (embeddings and norms kept F32)"
                                            if q in PROJECTIONS_ONLY else "")
                 for q, b in plan["weights_bytes_by_quant"].items()),
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
    from localchat.models.planner import build_plan, model_size  # reads GGUF tensors: gguf

    plan = build_plan(model_size(resolve_model_facts(args.model)), budgets, ctx)
    print(json.dumps(plan) if args.json else format_plan(plan))
    return 0
