"""Q6_K repacked at load into 8-row interleaved blocks (q6x8.cpp, built with the q4q8 ops):
each step of the AVX2 kernel serves 8 weight rows with one activation load and one scale
multiply, as ggml's repacked kernels do. Same sums as Q6Q8Linear, in llama.cpp's order."""

from __future__ import annotations

import torch

from localchat.engine.executors.torch.q4q8 import BlockLinear
from localchat.engine.executors.torch.q4x8 import TILE, by_tile, interleaved_codes, tiles


def interleaved_top_bits(top: torch.Tensor) -> torch.Tensor:
    """Top 2 bits 0..3 [N, K] as q6x8.cpp's [N8/8, K/32, half 2, row 8, byte 4]: bits 2c..2c+1
    of byte k hold weight 16·half + 4c + k's of its 32."""
    t = tiles(top.to(torch.uint8))  # [tiles, row, K]
    t = t.reshape(t.shape[0], TILE, -1, 2, 4, 4)  # [tiles, row, K/32, half, c, k]
    shifted = t.to(torch.int32) << (2 * torch.arange(4)).view(1, 1, 1, 1, 4, 1)
    return shifted.sum(4).to(torch.uint8).permute(0, 2, 3, 1, 4).contiguous()


class Q6Kx8Linear(BlockLinear):
    """Q6_K in 6.625 bits, 8 rows interleaved: w = d·sc·(q − 32) with the file's int8 sc per
    16 and d per 256 (as float32); x rounded to Q8_K, summed as llama.cpp's Q6_K dot product
    (integer sums per 256, then one float multiply by d·dx)."""

    def __init__(self, codes: torch.Tensor, sc: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(*codes.shape, device, 256)
        u = codes.to(torch.int32) + 32  # 0..63
        low, top = interleaved_codes(u & 0x0F), interleaved_top_bits(u >> 4)
        n8 = low.shape[0]
        self.blocks = torch.cat([low.reshape(n8, -1, 128), top.reshape(n8, -1, 64)], -1).contiguous()
        pairs = tiles(sc.to(torch.int8)).reshape(n8, TILE, -1, 2)  # [tiles, row, K/32, half]
        self.sub_scale = pairs.permute(0, 2, 1, 3).contiguous()  # [tiles, K/32, row, half]
        self.scale = by_tile(d.float())  # [tiles, K/256, row]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q6kx8_mm(
            x.reshape(-1, self.in_features), self.blocks, self.sub_scale, self.scale,
            self.out_features), x)
