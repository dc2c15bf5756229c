"""GPTQ (Frantar et al., 2022) for one weight matrix: columns quantized in order, each one's
error spread over the rest through the inverse Hessian; act-order with static groups, so
g_idx stays col // group_size. formats/gptq.py's pack_v1() writes AutoGPTQ's v1 layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GPTQResult:
    dequantized: torch.Tensor  # [rows, cols] float32
    codes: torch.Tensor  # [rows, cols] int32 in 0..2^bits − 1
    scales: torch.Tensor  # [groups, rows]
    zeros: torch.Tensor  # [groups, rows] int32
    g_idx: torch.Tensor  # [cols] int32
    damp: float  # the damping that let Cholesky succeed


def hessian(inputs: torch.Tensor) -> torch.Tensor:
    """H = 2/n · Σ x xᵀ over calibration inputs [n, cols] (float64 accumulation)."""
    x = inputs.reshape(-1, inputs.shape[-1]).double()
    return (2.0 / x.shape[0]) * (x.t() @ x)


def _grid(w: torch.Tensor, maxq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row asymmetric min/max scale and integer zero for columns w [rows, k]."""
    lo = w.min(dim=1).values.clamp(max=0)
    hi = w.max(dim=1).values.clamp(min=0)
    flat = (hi - lo) == 0
    lo, hi = torch.where(flat, lo - 1, lo), torch.where(flat, hi + 1, hi)
    scale = (hi - lo) / maxq
    return scale, torch.round(-lo / scale)


def _grid_v1(w: torch.Tensor, maxq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """_grid with zero >= 1: GPTQ v1 stores zero − 1 in `bits` bits, so a zero of 0 would
    be read back as 2^bits by every v1 loader (the bug checkpoint_format gptq_v2 fixes).
    A row whose grid would start at zero 0 (min w ≥ −scale/2) gets zero 1 and the scale
    (hi − lo)/(maxq − 1) instead, which still spans [lo, hi]."""
    scale, zero = _grid(w, maxq)
    low = zero < 1
    if bool(low.any()):
        lo = w.min(dim=1).values.clamp(max=0)
        hi = w.max(dim=1).values.clamp(min=0)
        scale = torch.where(low, (hi - lo).clamp(min=1e-12) / (maxq - 1), scale)
        zero = torch.where(low, torch.ones_like(zero), zero)
    return scale, zero


def _quant(w: torch.Tensor, scale, zero, maxq: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.clamp(torch.round(w / scale) + zero, 0, maxq)
    return scale * (q - zero), q


def _inverse_cholesky(h: torch.Tensor, percdamp: float, retries: int = 6) -> tuple[torch.Tensor, float]:
    damp = percdamp * torch.mean(torch.diag(h)).item()
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    for _ in range(retries):
        try:
            lower = torch.linalg.cholesky(h + damp * eye)
            inv = torch.cholesky_inverse(lower)
            return torch.linalg.cholesky(inv, upper=True), damp
        except torch.linalg.LinAlgError:
            damp *= 10
    raise ValueError("the Hessian is not positive definite even with damping "
                     f"{damp:.3g}; give more calibration text")


def _column_loop(wt, hinv, codes, col_scale, col_zero, maxq: int, blocksize: int) -> None:
    """Quantize wᵀ's rows (the columns) in order, each one's error spread over the rest."""
    cols = wt.shape[0]
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        w1, hinv1 = wt[i1:i2].clone(), hinv[i1:i2, i1:i2]
        err1 = torch.empty_like(w1)
        diag = torch.diagonal(hinv1).tolist()
        for i in range(i2 - i1):
            s_, z_ = col_scale[i1 + i], col_zero[i1 + i]
            c = torch.clamp(torch.round(w1[i] / s_) + z_, 0, maxq)
            codes[i1 + i] = c
            e = torch.sub(w1[i], s_ * (c - z_)).div_(diag[i])
            w1[i:].addr_(hinv1[i, i:], e, alpha=-1)
            err1[i] = e
        wt[i2:] -= hinv[i1:i2, i2:].t() @ err1


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, bits: int = 4, group_size: int = 128,
                  act_order: bool = True, percdamp: float = 0.01,
                  blocksize: int = 128) -> GPTQResult:
    w = w.double().clone()
    h = h.double().clone()
    rows, cols = w.shape
    maxq = 2 ** bits - 1
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    groups = [_grid_v1(w[:, g:g + group_size], maxq) for g in range(0, cols, group_size)]  # static
    # scales as float16 holds them (the file's type), so the weights GPTQ sees are the
    # weights the file gives back; never below float16's smallest normal number
    groups = [(s.clamp(min=2.0 ** -14).half().double(), z) for s, z in groups]
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(cols)
    w, h = w[:, perm], h[perm][:, perm]
    hinv, damp = _inverse_cholesky(h, percdamp)
    # the column loop in float32 (as the reference), on wᵀ so each column is contiguous;
    # each column's static scale and zero looked up once, in the permuted order
    group_of = perm // group_size
    scales = torch.stack([s for s, _ in groups])  # [groups, rows]
    zeros = torch.stack([z for _, z in groups])
    col_scale, col_zero = scales[group_of].float(), zeros[group_of].float()  # [cols, rows]
    wt, hinv = w.t().float().contiguous(), hinv.float()
    codes = torch.empty_like(wt)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of small ops: threads only add waiting (2-5x here)
    try:
        _column_loop(wt, hinv, codes, col_scale, col_zero, maxq, blocksize)
    finally:
        torch.set_num_threads(threads)
    inv = torch.argsort(perm)
    codes = codes[inv].t().contiguous()  # [rows, cols], original column order
    g_idx = torch.arange(cols) // group_size
    deq = scales.t()[:, g_idx] * (codes.double() - zeros.t()[:, g_idx])
    return GPTQResult(
        dequantized=deq.float(), codes=codes.to(torch.int32),
        scales=scales.float(), zeros=zeros.to(torch.int32),
        g_idx=g_idx.to(torch.int32), damp=damp)


def split_rows(r: GPTQResult, sizes: list[int]) -> list[GPTQResult]:
    """A result for matrices stacked by rows (q/k/v, gate/up share one Hessian: rows are
    quantized independently, so stacking them is exact) -> one result per matrix."""
    out, start = [], 0
    for n in sizes:
        rows = slice(start, start + n)
        out.append(GPTQResult(r.dequantized[rows].clone(), r.codes[rows].clone(),
                              r.scales[:, rows].clone(), r.zeros[:, rows].clone(),
                              r.g_idx.clone(), r.damp))
        start += n
    return out
