"""Q6_K repacked at load into 8-row interleaved blocks (q6x8.cpp, built with the q4q8 ops):
each step of the AVX2 kernel serves 8 weight rows with one activation load and one scale
multiply, as ggml's repacked kernels do. Same sums as Q6Q8Linear, in llama.cpp's order."""

from __future__ import annotations

import torch

from localchat.engine.executors.torch.q4q8 import BlockLinear
from localchat.engine.executors.torch.q4x8 import TILE, by_tile, tiles


def interleaved_blocks(u: torch.Tensor) -> torch.Tensor:
    """Codes q + 32 (0..63) [N, K] as q6x8.cpp's blocks [N8/8, K/32, 192]: 4 chunks [row 8,
    byte 4], byte k of chunk c holding weight 4c + k's code and weight 16 + 4c + k's top 2 bits
    (bits 6..7), then 2 chunk pairs [row 8, byte 4], byte k of pair p holding the low 4 bits of
    weights 16 + 8p + k and 20 + 8p + k (high nibble)."""
    t = tiles(u.to(torch.uint8)).reshape(-1, TILE, u.shape[1] // 32, 2, 4, 4)  # [.., half, c, k]
    lo, hi = t[:, :, :, 0], t[:, :, :, 1]  # [tiles, row, K/32, c, k]
    chunks = lo | ((hi >> 4) << 6)
    nib = (hi & 0x0F).reshape(*hi.shape[:3], 2, 2, 4)  # [.., pair, c % 2, k]
    pairs = nib[..., 0, :] | (nib[..., 1, :] << 4)
    n8, g = t.shape[0], t.shape[2]
    return torch.cat([chunks.permute(0, 2, 3, 1, 4).reshape(n8, g, 128),
                      pairs.permute(0, 2, 3, 1, 4).reshape(n8, g, 64)], -1).contiguous()


class Q6Kx8Linear(BlockLinear):
    """Q6_K in 6.625 bits, 8 rows interleaved: w = d·sc·(q − 32) with the file's int8 sc per
    16 and d per 256 (as float32); x rounded to Q8_K, summed as llama.cpp's Q6_K dot product
    (integer sums per 256, then one float multiply by d·dx)."""

    def __init__(self, codes: torch.Tensor, sc: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(*codes.shape, device, 256)
        self.blocks = interleaved_blocks(codes.to(torch.int32) + 32)
        pairs = tiles(sc.to(torch.int8)).reshape(-1, TILE, sc.shape[1] // 2, 2)  # [.., K/32, half]
        self.sub_scale = pairs.permute(0, 2, 1, 3).contiguous()  # [tiles, K/32, row, half]
        self.scale = by_tile(d.float())  # [tiles, K/256, row]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q6kx8_mm(
            x.reshape(-1, self.in_features), self.blocks, self.sub_scale, self.scale,
            self.out_features), x)
