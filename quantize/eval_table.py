"""`localchat eval --table`: every scheme on one model in one command, each row the float32
reference with its block projections simulated (quantize/simulate.py); columns: bits per
weight, matrix error, perplexity, KL, top-1 agreement and α; distilled drafts beside them."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from localchat.errors import UsageError
from localchat.models.facts import GGUFFacts
from quantize.matrix_stats import matrix_error, summarize
from quantize.quality import Protocol, compare, perplexity, scored_logprobs, targets, text_tokens, windows
from quantize.schemes import TABLE_SCHEMES
from quantize.simulate import projections, simulated_model

NOTE = ("simulated with dequantized weights: block projections quantized and dequantized "
        "to float32; embeddings, output matrix and norms float32 in every row")


def scored_text(facts: GGUFFacts, protocol, text_file: str | None):
    """The evaluation text's token ids (by this model's vocabulary) and scoring windows."""
    from localchat.engine.executors.torch.executor import open_vocabulary

    vocab = open_vocabulary(facts.path)
    try:
        spans = windows(protocol.tokens, protocol.window, protocol.stride)
        return text_tokens(vocab, spans[-1][1], text_file), spans
    finally:
        vocab.close()


def float32_weights(facts: GGUFFacts):
    """The model's weights as float32 DenseLinear layers (exact dequantization)."""
    from localchat.engine.executors.torch.executor import open_weights

    if facts.path.is_dir() or facts.quant_type == "F32":
        return open_weights(facts.path)
    from quantize.gguf_convert import dequantize_gguf

    with tempfile.TemporaryDirectory(prefix="localchat-eval-") as tmp:
        return open_weights(dequantize_gguf(facts.path, Path(tmp) / "float32.gguf"))


def run_table(facts: GGUFFacts, protocol: Protocol, schemes=TABLE_SCHEMES,
              text_file: str | None = None, drafts: list[GGUFFacts] = (),
              log: Callable[[str], None] = lambda line: None) -> dict:
    """Each scheme simulated on facts' float32 weights, then each draft file (a distilled
    student, fewer layers), scored against the float32 reference on the same text. `log`
    gets a progress line after the reference and after each row."""
    torch.manual_seed(0)
    started, n_rows = time.perf_counter(), len(schemes) + len(drafts)

    def done(row: dict) -> None:
        log(f"eval --table: {len(rows)}/{n_rows} {row['scheme']}: perplexity "
            f"{row['perplexity']:.3f}, top-1 agreement {row['agreement']:.1%} "
            f"({time.perf_counter() - started:.0f} s)")
    ref = float32_weights(facts)
    tokens, spans = scored_text(facts, protocol, text_file)
    target = targets(tokens, spans)
    ref_lp = scored_logprobs(ref, tokens, spans)
    outliers = summarize([matrix_error(n, w, w) for n, w in projections(ref)])
    reference = {"model": facts.name, "weights": f"float32 of {facts.quant_type}"} | \
        perplexity(ref_lp, target) | {k: outliers[k] for k in (
            "matrices", "max_over_std", "median_max_over_std", "outliers_6sigma", "outlier_fraction")}
    log(f"eval --table: reference perplexity {reference['perplexity']:.3f} "
        f"({time.perf_counter() - started:.0f} s); {n_rows} rows to go")
    rows = []
    for scheme in schemes:
        model, errors, bpw = simulated_model(ref, scheme)
        s = summarize(errors)
        q = compare(ref_lp, scored_logprobs(model, tokens, spans), target,
                    gamma=protocol.gamma, cost_ratio=protocol.cost_ratio)
        rows.append({"scheme": scheme, "bits_per_weight": bpw,
                     "worst_rel_error": s["worst_rel_error"], "worst_matrix": s["worst_matrix"],
                     "median_rel_error": s["median_rel_error"]} | q)
        done(rows[-1])
        del model
    from localchat.engine.executors.torch.executor import open_weights

    for draft in drafts:
        if draft.vocab_size != facts.vocab_size:
            raise UsageError(f"the draft {draft.name} has another vocabulary than {facts.name}")
        q = compare(ref_lp, scored_logprobs(open_weights(draft.path), tokens, spans), target,
                    gamma=protocol.gamma, cost_ratio=protocol.cost_ratio)
        rows.append({"scheme": f"draft: {draft.n_layers} of {facts.n_layers} layers "
                               f"({draft.quant_type})", "draft": str(draft.path),
                     "bits_per_weight": None, "worst_rel_error": None, "worst_matrix": None,
                     "median_rel_error": None} | q)
        done(rows[-1])
    return {"reference": reference, "rows": rows, "protocol": protocol.as_dict(), "note": NOTE}


def format_table(result: dict, protocol: Protocol) -> str:
    ref = result["reference"]
    lo, hi = ref["perplexity_ci95"]
    lines = [f"{ref['model']}: {NOTE}.", f"Protocol: {protocol.describe()}.",
             f"Reference ({ref['weights']}): perplexity {ref['perplexity']:.3f} "
             f"[{lo:.3f}, {hi:.3f}]; weights max|w|/σ up to {ref['max_over_std']:.0f} "
             f"(median {ref['median_max_over_std']:.0f}), {ref['outliers_6sigma']} beyond 6σ "
             f"({ref['outlier_fraction']:.3%}) over {ref['matrices']} matrices", "",
             f"| scheme | bits/weight | worst rel. error | median rel. error | perplexity (95 % CI) "
             f"| KL | top-1 agreement | α | speedup γ=4, c={protocol.cost_ratio} |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    def num(value, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    for r in result["rows"]:
        lo, hi = r["perplexity_ci95"]
        lines.append(f"| {r['scheme']} | {num(r['bits_per_weight'], '.3f')} "
                     f"| {num(r['worst_rel_error'], '.4f')} | {num(r['median_rel_error'], '.4f')} "
                     f"| {r['perplexity']:.3f} ({lo:.2f}–{hi:.2f}) "
                     f"| {r['kl_divergence']:.4f} | {r['agreement']:.2%} | {r['alpha']:.3f} "
                     f"| {r['predicted_speedup']:.2f}x |")
    return "\n".join(lines)
