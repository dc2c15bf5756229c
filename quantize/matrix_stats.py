"""Per weight matrix: what quantization changed (relative Frobenius error) and how hard the
matrix was to begin with (max|w| / std, weights beyond 6σ: outliers stretch absmax scales)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch


@dataclass
class MatrixError:
    name: str
    numel: int
    rel_error: float
    max_over_std: float
    outliers_6sigma: int


def matrix_error(name: str, w: torch.Tensor, w_hat: torch.Tensor,
                 outliers: bool = True) -> MatrixError:
    """outliers=False skips the statistics of W (they do not depend on the scheme)."""
    w, w_hat = w.float(), w_hat.float()
    rel = ((w - w_hat).norm() / w.norm().clamp_min(1e-30)).item()
    if not outliers:
        return MatrixError(name, w.numel(), rel, float("nan"), 0)
    std = w.std().item()
    centred = (w - w.mean()).abs()
    return MatrixError(
        name=name, numel=w.numel(),
        rel_error=rel,
        max_over_std=(w.abs().max().item() / std) if std > 0 else 0.0,
        outliers_6sigma=int((centred > 6 * std).sum().item()),
    )


def summarize(errors: list[MatrixError]) -> dict:
    """Worst and median relative error, and the outlier picture over all matrices."""
    if not errors:
        return {"matrices": 0}
    worst = max(errors, key=lambda e: e.rel_error)
    return {
        "matrices": len(errors),
        "worst_rel_error": worst.rel_error,
        "worst_matrix": worst.name,
        "median_rel_error": statistics.median(e.rel_error for e in errors),
        "max_over_std": max(e.max_over_std for e in errors),
        "median_max_over_std": statistics.median(e.max_over_std for e in errors),
        "outliers_6sigma": sum(e.outliers_6sigma for e in errors),
        "outlier_fraction": sum(e.outliers_6sigma for e in errors) / sum(e.numel for e in errors),
    }
