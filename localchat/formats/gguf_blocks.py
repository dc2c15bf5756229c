"""GGUF tensors: dequantized to float32 (dequantize_tensor), and quantized blocks as integer
codes and scales, exactly (no rounding): the forms the kernels take, and how llama.cpp rounds
each type's activations (its vec_dot_type)."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K as GGUFQ4K
from gguf.quants import dequantize

GROUP = 32  # weights per block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or per sub-block (Q4_K, Q5_K)
SUPER = 256  # weights per K-quant super-block

# llama.cpp's vec_dot_type: how it rounds a matmul's activations for each weight type
ACTIVATION_ROUNDING = {Q.Q4_0: "q8_0", Q.Q4_1: "q8_1", Q.Q5_0: "q8_0", Q.Q5_1: "q8_1",
                       Q.Q8_0: "q8_0", Q.Q2_K: "q8_k", Q.Q3_K: "q8_k", Q.Q4_K: "q8_k", Q.Q5_K: "q8_k",
                       Q.Q6_K: "q8_k"}


def dequantize_tensor(raw: np.ndarray, ggml_type: int, ggml_shape) -> torch.Tensor:
    """A GGUF tensor's data as float32 in PyTorch's order (ggml lists the fastest dimension
    first: `ggml_shape` as the file gives it)."""
    shape = tuple(reversed([int(n) for n in ggml_shape]))
    if ggml_type == Q.F32:
        arr = np.frombuffer(raw, dtype=np.float32).copy()
    else:
        arr = dequantize(raw.reshape(shape[:-1] + (-1,)), ggml_type).astype(np.float32)
    return torch.from_numpy(arr.reshape(shape))


def activation_rounding(types) -> str | None:
    """One rounding for matrices fused by rows, or None where llama.cpp's differ (Q8_0 and
    Q8_1 give the same codes and scales: only Q4_1's offset term uses Q8_1's sum)."""
    found = {ACTIVATION_ROUNDING.get(t) for t in types}
    if found <= {"q8_0", "q8_1"}:
        return "q8_1" if "q8_1" in found else "q8_0"
    return found.pop() if len(found) == 1 else None  # None: a float type, or Q8_K with another


def _f16(blocks: np.ndarray, at: int, dtype=np.float32) -> np.ndarray:
    return blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(dtype)


def _k_scales(blocks: np.ndarray, n_rows: int, n_cols: int):
    """A Q4_K/Q5_K super-block's 6-bit sub-block scales and mins (uint8 [N, K/32]) and its
    float32 (d, dmin) [N, K/256, 2]."""
    sc, mins = GGUFQ4K.get_scale_min(blocks[:, 4:16])  # [B, 8] each, as gguf-py unpacks
    sup = np.stack([_f16(blocks, 0), _f16(blocks, 2)], axis=-1).reshape(n_rows, n_cols // SUPER, 2)
    return (sc.astype(np.uint8).reshape(n_rows, -1), mins.astype(np.uint8).reshape(n_rows, -1),
            sup)


def group_scales(scale, minimum, sup) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-32 scales and offsets as float32 from the form the file holds them in: float16, or
    (sup given) K-quants' 6-bit integers with w = d·sc·q − dmin·m."""
    if sup is None:
        return (np.asarray(scale, dtype=np.float32),
                None if minimum is None else np.asarray(minimum, dtype=np.float32))
    per_group = np.repeat(np.asarray(sup, dtype=np.float32), 8, axis=1)  # [N, K/32, 2]
    return (per_group[..., 0] * np.asarray(scale, dtype=np.float32),
            -(per_group[..., 1] * np.asarray(minimum, dtype=np.float32)))


def q4_blocks(raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int):
    """A Q4_0/Q4_1/Q4_K matrix as (codes 0..15 packed as pack_nibbles does [N, K/2] uint8,
    scale, minimum [N, K/32], sup) with w = q·scale + minimum per 32 weights, scales as the
    file holds them (group_scales): float16 (Q4_0's minimum −8·d), or Q4_K's integers with
    sup. Q4_0/Q4_1 bytes are copied as they are (the file packs them so)."""
    if ggml_type == Q.Q4_K:
        blocks = raw.reshape(-1, 144)
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        halves = (qs & 0x0F).reshape(n_rows, -1, 2, 16)  # per 32: weights 0-15, 16-31
        packed = halves[:, :, 0] | (halves[:, :, 1] << 4)
        return (packed.reshape(n_rows, -1), *_k_scales(blocks, n_rows, n_cols))
    with_min = ggml_type == Q.Q4_1
    fields = [("d", "<f2"), *([("m", "<f2")] if with_min else []), ("qs", "u1", (16,))]
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.dtype(fields))
    d = blocks["d"].reshape(n_rows, -1).copy()
    packed = np.ascontiguousarray(blocks["qs"]).reshape(n_rows, -1)
    minimum = blocks["m"].reshape(n_rows, -1).copy() if with_min else \
        (torch.from_numpy(d) * -8).numpy()  # numpy's float16 arithmetic is 8x slower
    return packed, d, minimum, None


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] (their low 4 bits) two to a byte as GGUF packs a Q4_0 block of 32: byte
    i holds weight i in its low nibble and weight i + 16 in its high one."""
    g = q.to(torch.uint8).view(q.shape[0], -1, 2, 16) & 0x0F
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(q.shape[0], -1).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """pack_nibbles' inverse: codes 0..15 [N, 2·B] uint8."""
    g = packed.view(packed.shape[0], -1, 1, 16)
    return torch.cat([g & 0x0F, g >> 4], dim=2).reshape(packed.shape[0], -1)


def q8_parts(raw: np.ndarray, n_rows: int, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 matrix as (codes int8 [N, K], scales float16 [N, K/32])."""
    blocks = raw.reshape(n_rows, n_cols // GROUP, 34)
    codes = blocks[..., 2:].copy().view(np.int8).reshape(n_rows, n_cols)
    return torch.from_numpy(codes), torch.from_numpy(_f16(blocks, 0, np.float16))


def q5_blocks(raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int):
    """A Q5_0/Q5_1/Q5_K matrix as (q [N, K] int32 in 0..31, scale, minimum or None [N, K/32],
    sup) with w = q·scale + minimum per 32, or Q5_0's w = (q − 16)·scale, scales as in
    q4_blocks. Q5_0/Q5_1: byte j of the 16 holds weights j (low nibble) and j + 16, bit i of
    qh weight i's fifth bit; Q5_K: bit j of qh's byte l is sub-block j's weight l
    (dequantize_row_q5_K's order)."""
    if ggml_type == Q.Q5_K:
        blocks = raw.reshape(-1, 176)
        qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        ql = blocks[:, 48:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (ql & 0x0F).reshape(-1, 8, 32) | ((qh & 1) << 4)
        return (q.reshape(n_rows, n_cols).astype(np.int32), *_k_scales(blocks, n_rows, n_cols))
    with_min = ggml_type == Q.Q5_1
    blocks = raw.reshape(n_rows, n_cols // GROUP, 24 if with_min else 22)
    qh = blocks[..., -20:-16].copy().view(np.uint32)  # [N, K/32, 1]
    high = (qh >> np.arange(GROUP, dtype=np.uint32)) & 1
    qs = blocks[..., -16:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1) | (high << 4).astype(np.uint8)
    return (q.reshape(n_rows, n_cols).astype(np.int32), _f16(blocks, 0, np.float16),
            _f16(blocks, 2, np.float16) if with_min else None, None)


def q6k_parts(raw: np.ndarray, n_rows: int, n_cols: int):
    """A Q6_K matrix as (codes q − 32 int8 [N, K], sc int8 [N, K/16], d [N, K/256]) with
    w = d·sc·(q − 32): per 128 weights, ql's low then high nibbles of bytes 0-63 and qh's
    2-bit pairs, as ggml's dequantize_row_q6_K reads them."""
    blocks = raw.reshape(-1, 210)
    ql, qh = blocks[:, :128].reshape(-1, 2, 64), blocks[:, 128:192].reshape(-1, 2, 1, 32)
    sc = blocks[:, 192:208].copy().view(np.int8)
    low = np.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4],
                   axis=2)  # [B, 2 halves, 4 quarters, 32]
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    codes = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)
    return (torch.from_numpy(codes.reshape(n_rows, n_cols)),
            torch.from_numpy(sc.reshape(n_rows, n_cols // 16).copy()),
            torch.from_numpy(_f16(blocks, 208).reshape(n_rows, n_cols // SUPER)))


def q3k_parts(raw: np.ndarray, n_rows: int, n_cols: int):
    """A Q3_K matrix as (codes int8 in −4..3 [N, K], sc int8 [N, K/16], d [N, K/256]) with
    w = d·sc·code: per 128 weights, qs's bit pairs 0-1, 2-3, 4-5, 6-7 of bytes 0-31, the code
    lowered by 4 where hmask's bit is clear, and 6-bit scales − 32, as dequantize_row_q3_K."""
    blocks = raw.reshape(-1, 110)
    shifts4 = np.array([0, 2, 4, 6], dtype=np.uint8)
    ql = blocks[:, 32:96].reshape(-1, 2, 1, 32) >> shifts4.reshape(1, 1, 4, 1)
    hm = blocks[:, :32].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    codes = (ql & 3).reshape(-1, 8, 32).astype(np.int8) - 4 * ((hm & 1) ^ 1).astype(np.int8)
    low = blocks[:, 96:104].reshape(-1, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    high = blocks[:, 104:108].reshape(-1, 1, 4) >> shifts4.reshape(1, 4, 1)
    sc = ((low.reshape(-1, 16) & 0x0F) | ((high.reshape(-1, 16) & 3) << 4)).astype(np.int8) - 32
    return (torch.from_numpy(codes.reshape(n_rows, n_cols)),
            torch.from_numpy(sc.reshape(n_rows, n_cols // 16)),
            torch.from_numpy(_f16(blocks, 108).reshape(n_rows, n_cols // SUPER)))


def q2k_parts(raw: np.ndarray, n_rows: int, n_cols: int):
    """A Q2_K matrix as (codes uint8 in 0..3 [N, K], the scale bytes [N, K/16], d and dmin
    [N, K/256]) with w = d·(byte & 15)·code − dmin·(byte >> 4) per 16: codes from qs's bit
    pairs as in Q3_K, as dequantize_row_q2_K reads them."""
    blocks = raw.reshape(-1, 84)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    ql = blocks[:, 16:80].reshape(-1, 2, 1, 32) >> shifts
    return (torch.from_numpy((ql & 3).reshape(n_rows, n_cols)),
            torch.from_numpy(blocks[:, :16].reshape(n_rows, n_cols // 16).copy()),
            torch.from_numpy(_f16(blocks, 80).reshape(n_rows, n_cols // SUPER)),
            torch.from_numpy(_f16(blocks, 82).reshape(n_rows, n_cols // SUPER)))


INT4_EXACT = (Q.Q4_0, Q.Q4_1, Q.Q4_K)  # types PyTorch's int4 kernel reproduces exactly


def _int8_codes(ggml_type: int, raw: np.ndarray, n_rows: int, n_cols: int):
    """Q8_0's codes, or Q5_0's as q − 16, with their scale per 32."""
    if ggml_type == Q.Q8_0:
        return q8_parts(raw, n_rows, n_cols)
    q, d, _, _ = q5_blocks(raw, ggml_type, n_rows, n_cols)
    return torch.from_numpy(q - 16).to(torch.int8), torch.from_numpy(d)


def _joined_blocks(blocks: list[tuple]) -> tuple:
    """q4_blocks/q5_blocks results stacked by rows; their scales as float32 where the parts
    hold them in different forms (Q4_K beside Q4_0)."""
    if len({b[1].dtype for b in blocks}) > 1:
        blocks = [(q, *group_scales(*rest), None) for q, *rest in blocks]

    def cat(xs):
        return None if xs[0] is None else torch.from_numpy(np.concatenate(xs))
    return tuple(cat(xs) for xs in zip(*blocks))


def kernel_forms(parts: list[tuple[int, np.ndarray, int, int]]) -> dict:
    """Matrices stacked by rows, each (ggml type, raw blocks, rows, columns), in every exact
    form some kernel takes (kernels.SourceMatrix's fields): q2/q3/q4/q5/q6/q8 blocks,
    and how llama.cpp rounds their activations."""
    types = {p[0] for p in parts}

    def joined(unpack) -> tuple:
        return tuple(torch.cat(xs) for xs in zip(*(unpack(*p) for p in parts)))

    forms: dict = {"activations": activation_rounding(types)}
    if types <= {Q.Q8_0, Q.Q5_0}:
        forms["q8_blocks"] = joined(_int8_codes)
    if len(types) == 1 and types <= {Q.Q5_0, Q.Q5_1, Q.Q5_K}:
        forms["q5_blocks"] = _joined_blocks([q5_blocks(raw, t, n, k) for t, raw, n, k in parts])
    if types == {Q.Q6_K}:
        forms["q6_blocks"] = joined(lambda _, raw, n, k: q6k_parts(raw, n, k))
    if types == {Q.Q3_K}:
        forms["q3_blocks"] = joined(lambda _, raw, n, k: q3k_parts(raw, n, k))
    if types == {Q.Q2_K}:
        forms["q2_blocks"] = joined(lambda _, raw, n, k: q2k_parts(raw, n, k))
    if types <= set(INT4_EXACT):  # int4pack's form is made from these when it is measured
        forms["q4_blocks"] = _joined_blocks([q4_blocks(raw, t, n, k) for t, raw, n, k in parts])
    return forms
