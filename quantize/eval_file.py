"""`localchat eval -m MODEL [--reference REF]` and `localchat quantize --report`: one model file
measured through the torch engine's own layers for its format, optionally against a float32
reference."""

from __future__ import annotations

import statistics

from localchat.errors import UsageError
from localchat.models.facts import GGUFFacts
from quantize.eval_table import float32_weights, scored_text
from quantize.file_matrices import projection_matrices
from quantize.matrix_stats import matrix_error, summarize
from quantize.quality import Protocol, compare, perplexity, scored_logprobs, targets


def evaluate_file(facts: GGUFFacts, protocol: Protocol, reference: GGUFFacts | None = None,
                  text_file: str | None = None) -> dict:
    from localchat.engine.executors.torch.executor import open_weights

    if reference is not None and reference.vocab_size != facts.vocab_size:
        raise UsageError(f"{facts.name} and the reference {reference.name} have different "
                         f"vocabularies ({facts.vocab_size} vs {reference.vocab_size} tokens)")
    tokens, spans = scored_text(reference or facts, protocol, text_file)
    target = targets(tokens, spans)
    model_lp = scored_logprobs(open_weights(facts.path), tokens, spans)
    matrices, bits = projection_matrices(facts)
    result = {"model": str(facts.path), "quant_type": facts.quant_type,
              "file_size": facts.file_size, "bits_per_weight": bits,
              "protocol": protocol.as_dict()}
    if reference is None:
        errors = [matrix_error(n, w, w) for n, w in matrices.items()]
        s = summarize(errors)
        return result | perplexity(model_lp, target) | {
            k: s[k] for k in ("max_over_std", "median_max_over_std", "outliers_6sigma")}
    ref_matrices, ref_bits = projection_matrices(reference)
    reference_part = {"reference": {"model": str(reference.path), "quant_type": reference.quant_type,
                                    "file_size": reference.file_size, "bits_per_weight": ref_bits}}
    comparison = lambda ref_lp: compare(ref_lp, model_lp, target, gamma=protocol.gamma,  # noqa: E731
                                        cost_ratio=protocol.cost_ratio)
    if facts.n_layers < reference.n_layers:  # a draft cut from the reference: no matrix pairs
        ref_lp = scored_logprobs(float32_weights(reference), tokens, spans)
        reference_part["reference"] |= perplexity(ref_lp, target)
        return result | reference_part | {"draft_layers": facts.n_layers,
                                          "reference_layers": reference.n_layers} | comparison(ref_lp)
    missing = sorted(set(ref_matrices) ^ set(matrices))
    if missing:
        raise UsageError(f"{facts.name} and {reference.name} differ in their matrices "
                         f"(e.g. {missing[0]})")
    errors = [matrix_error(n, ref_matrices[n], matrices[n]) for n in sorted(matrices)]
    s = summarize(errors)
    ref_lp = scored_logprobs(float32_weights(reference), tokens, spans)
    reference_part["reference"] |= perplexity(ref_lp, target)
    return result | reference_part | {
        "worst_rel_error": s["worst_rel_error"], "worst_matrix": s["worst_matrix"],
        "median_rel_error": s["median_rel_error"], "max_over_std": s["max_over_std"],
        "median_max_over_std": s["median_max_over_std"], "outliers_6sigma": s["outliers_6sigma"],
        "rel_error_quartiles": statistics.quantiles([e.rel_error for e in errors], n=4),
    } | comparison(ref_lp)


def format_report(r: dict, protocol: Protocol) -> str:
    lo, hi = r["perplexity_ci95"]
    lines = [f"{r['model']} ({r['quant_type']}, {r['file_size'] / 2**20:.1f} MiB, "
             f"{r['bits_per_weight']:.3f} bits per projection weight)",
             f"  protocol: {protocol.describe()}",
             f"  perplexity {r['perplexity']:.3f} [{lo:.3f}, {hi:.3f}]"]
    if "reference" in r:
        ref = r["reference"]
        rlo, rhi = ref["perplexity_ci95"]
        lines += [
            f"  reference {ref['model']} ({ref['quant_type']}, run as float32): perplexity "
            f"{ref['perplexity']:.3f} [{rlo:.3f}, {rhi:.3f}]",
            *([f"  a draft: {r['draft_layers']} layers against the reference's "
               f"{r['reference_layers']}"] if "draft_layers" in r else [
              f"  matrix error ‖W−Ŵ‖/‖W‖: worst {r['worst_rel_error']:.4f} ({r['worst_matrix']}), "
              f"median {r['median_rel_error']:.4f}",
              f"  reference weights: max|w|/σ up to {r['max_over_std']:.0f} (median "
              f"{r['median_max_over_std']:.0f}), {r['outliers_6sigma']} beyond 6σ"]),
            f"  KL {r['kl_divergence']:.4f} · top-1 agreement {r['agreement']:.2%} · "
            f"α {r['alpha']:.3f} → predicted speedup as a draft {r['predicted_speedup']:.2f}x "
            f"(γ = {protocol.gamma}, c = {protocol.cost_ratio})"]
    else:
        lines.append(f"  weights: max|w|/σ up to {r['max_over_std']:.0f}, "
                     f"{r['outliers_6sigma']} beyond 6σ (pass --reference SPEC to compare)")
    return "\n".join(lines)
