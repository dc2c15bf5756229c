"""Q4_0, Q4_1 and Q4_K repacked at load into 8-row interleaved blocks (q4x8.cpp, built with the
q4q8 ops): each step of the AVX2 kernel serves 8 weight rows with one activation load and one
scale multiply, as ggml's repacked kernels do. Same sums as Q4S8Linear / Q4Q8Linear (Q4_1, Q4_K),
from the same packed codes (gguf_blocks.pack_nibbles)."""

from __future__ import annotations

import torch

from localchat.engine.executors.torch.q4q8 import BlockLinear

TILE = 8  # weight rows interleaved


def tiles(t: torch.Tensor) -> torch.Tensor:
    """Rows [N, ...] padded with zeros to a multiple of TILE, as [N8 / TILE, TILE, ...]."""
    pad = -t.shape[0] % TILE
    if pad:
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
    return t.reshape(-1, TILE, *t.shape[1:])


def interleaved_codes(packed: torch.Tensor) -> torch.Tensor:
    """Codes [N, K/2] packed as gguf_blocks.pack_nibbles does (16 bytes a 32, byte i = weights
    i, i + 16) as q4x8.cpp's blocks [N8/8, K/32, chunk 4, row 8, byte 4]: byte k of chunk c
    holds weights 4c + k (low nibble) and 16 + 4c + k (high nibble) of its 32."""
    words = tiles(packed.contiguous().view(torch.int32))  # [tiles, row, K/8]: 4 bytes each
    moved = words.reshape(words.shape[0], TILE, -1, 4).permute(0, 2, 3, 1).contiguous()
    return moved.view(torch.uint8).reshape(*moved.shape[:-1], TILE, 4)


def by_tile(t: torch.Tensor) -> torch.Tensor:
    """Per-row values [N, G] as [N8/8, G, 8]: a block's 8 rows side by side."""
    return tiles(t).transpose(1, 2).contiguous()


class Q4S8x8Linear(BlockLinear):
    """Q4_0 in its own 4.5 bits, 8 rows interleaved: w = (q − 8)·d, d the file's float16 per
    32 weights; x rounded to Q8_0, summed as llama.cpp's Q4_0 dot product (exact)."""

    def __init__(self, packed: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(packed.shape[0], 2 * packed.shape[1], device)
        self.codes = interleaved_codes(packed)
        self.scale = by_tile(d.to(torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q4s8x8_mm(
            x.reshape(-1, self.in_features), self.codes, self.scale, self.out_features), x)


class Q41x8Linear(BlockLinear):
    """Q4_1 in its own 5 bits, 8 rows interleaved: w = q·d + m, d and m the file's float16 per
    32 weights; x rounded to Q8_1, summed as llama.cpp's Q4_1 dot product (as q4q8 does, up
    to float summation order)."""

    def __init__(self, packed: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(packed.shape[0], 2 * packed.shape[1], device)
        self.codes = interleaved_codes(packed)
        pairs = torch.stack([d.to(torch.float16), m.to(torch.float16)], dim=1)  # [N, 2, G]
        self.scale_offset = tiles(pairs).permute(0, 3, 2, 1).contiguous()  # [tiles, G, 2, row]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q41x8_mm(
            x.reshape(-1, self.in_features), self.codes, self.scale_offset, self.out_features), x)


class Q4Kx8Linear(BlockLinear):
    """Q4_K in 4.75 bits, 8 rows interleaved: w = d·sc·q − dmin·m with the file's 6-bit sc, m
    per 32 and (d, dmin) per 256 (`sup` [N, K/256, 2]); x rounded to Q8_K, summed as
    llama.cpp's Q4_K dot product (exact)."""

    def __init__(self, packed: torch.Tensor, sc: torch.Tensor, m: torch.Tensor, sup: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(packed.shape[0], 2 * packed.shape[1], device, 256)
        self.codes = interleaved_codes(packed)
        self.sub_scale = by_tile(sc.to(torch.uint8))
        pairs = tiles(m.to(torch.uint8).reshape(m.shape[0], -1, 2))  # [tiles, row, G/2, 2]
        self.minimum = pairs.permute(0, 2, 1, 3).contiguous()  # [tiles, G/2, row, 2]
        self.sup = tiles(sup.float()).permute(0, 2, 3, 1).contiguous()  # [tiles, G/8, 2, row]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q4kx8_mm(
            x.reshape(-1, self.in_features), self.codes, self.sub_scale, self.minimum, self.sup,
            self.out_features), x)

