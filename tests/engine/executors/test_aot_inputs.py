"""A compiled decode layer (aot_layer.py) takes each linear layer's weights as inputs: every
tensor a layer reads must be one of its plain tensor attributes (tensor_attrs). One read from
elsewhere was compiled in as a constant, so every layer ran layer 0's weights (NF4 replied
"Le   ,,,,, and,,,,"); such a layer is now refused and runs on torch.compile instead."""

from __future__ import annotations

import pytest
import torch

from localchat.engine.executors.torch import aot_layer
from localchat.engine.executors.torch.q4q8 import Q4Q8Linear, Q8Q8Linear, available
from localchat.engine.executors.torch.q4x8 import Q41x8Linear
from localchat.engine.executors.torch.qlinear import (DenseLinear, HalfLinear, Int4Linear,
                                                      Int4PairLinear, Int8Linear, NF4Linear,
                                                      RowStack)
from localchat.formats.gguf_blocks import pack_nibbles
from localchat.formats.nf4 import load_nf4, quantize_nf4

N, K = 64, 256


def _layers() -> dict[str, torch.nn.Module]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)
    d = torch.rand(N, K // 32, generator=g) + 0.5
    codes = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    layers = {
        "nf4": NF4Linear(load_nf4(quantize_nf4(w).get, "weight")),
        "dense": DenseLinear(w),
        "bf16": HalfLinear(w, torch.bfloat16),
        "int8": Int8Linear(codes, d[:, 0], torch.float32),
        "int4": Int4Linear(q, d, d, group=32),
        "int4-pair": Int4PairLinear(codes, d),
        "row-stack": RowStack([DenseLinear(w), NF4Linear(load_nf4(quantize_nf4(w).get, "weight"))]),
    }
    if available():
        layers["q4q8"] = Q4Q8Linear(pack_nibbles(q), d.half(), -8 * d.half())
        layers["q8q8"] = Q8Q8Linear(codes, d.half())
        layers["q41x8"] = Q41x8Linear(pack_nibbles(q), d.half(), -8 * d.half())
    return layers


LAYERS = _layers()


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_layer_reads_its_weights_from_its_tensor_attributes(name):
    layer = LAYERS[name]
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))
    tensors = [t for _, t in aot_layer.tensor_attrs(layer)]
    assert tensors
    with aot_layer.holding(layer, [torch.zeros_like(t) for t in tensors]):
        assert not layer(x).any()  # zero weights and scales: nothing of the real ones is read
    assert layer(x).abs().amax() > 1  # and the real ones are back


class _HiddenWeight(torch.nn.Module):
    """A layer keeping its weight where tensor_attrs cannot see it (as NF4Linear did)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.hidden = {"weight": weight}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.hidden["weight"].t()


@pytest.mark.model
def test_a_layer_with_a_hidden_weight_is_not_compiled_ahead_of_time(tmp_path):
    from helpers.tiny_models import write_random_model

    from localchat.engine.executors.torch.model import KVStore, LlamaModel
    from localchat.engine.executors.torch.weights import load_weights

    weights = load_weights(write_random_model(tmp_path / "tiny.gguf"))
    for layer in weights.layers:
        layer.wo = _HiddenWeight(layer.wo.weight)
    model = LlamaModel(weights, 128, compiled=True)
    kv = KVStore(weights.config, 128)
    with pytest.raises(RuntimeError, match="not its inputs"):
        aot_layer.load_decode_layer(weights.layers[0], model.rope, weights.config, kv)
