"""The q4q8 kernels (GGUF blocks times int8 activations, llama.cpp's arithmetic on x86): the
exact sums llama.cpp's scheme defines, and the whole model on them, compiled ahead of time,
against the model on PyTorch's int4 kernel. (Mapping and choice: test_kernels.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.teacher_forced import teacher_forced

from localchat.engine.executors.torch import kernels, q4q8, q4x8, q6x8
from localchat.formats.gguf_blocks import pack_nibbles

# every CPU: the kernels split their tiles among threads, and that split is under test too
pytestmark = [pytest.mark.skipif(not q4q8.available(), reason="no AVX2 CPU or C++ compiler"),
              pytest.mark.usefixtures("all_cpus")]


def _rounded_activations(x: np.ndarray, act: str):
    """llama.cpp's rounding of activations, transcribed: quantize_row_q8_0/_q8_1 (per 32,
    d = max|x| / 127 kept as fp16, codes round(x · 127 / max|x|); Q8_1 adds fp16(d · Σ codes))
    and quantize_row_q8_K_ref (per 256, iscale = −127 / the signed max, d = 1 / iscale).
    Per 32 values: codes, scale, scale · Σ codes."""
    f32 = np.float32
    if act == "q8_k":
        blocks = x.reshape(x.shape[0], -1, 256).astype(f32)
        at = np.abs(blocks).argmax(-1)[..., None]
        signed_max = np.take_along_axis(blocks, at, -1)
        iscale = (f32(-127) / signed_max).astype(f32)
        q = np.minimum(127, np.rint((iscale * blocks).astype(f32)))
        d = np.repeat((f32(1) / iscale)[..., 0], 8, axis=-1)
        q = q.reshape(x.shape[0], -1, 32)
        return q, d, d * q.sum(-1)
    groups = x.reshape(x.shape[0], -1, 32).astype(f32)
    amax = np.abs(groups).max(-1)
    q = np.rint((groups * (f32(127) / amax)[..., None]).astype(f32))
    d = (amax / f32(127)).astype(f32)
    dx = d.astype(np.float16).astype(f32)
    sx = (d * q.sum(-1)).astype(np.float16).astype(f32) if act == "q8_1" else dx * q.sum(-1)
    return q, dx, sx


def _expected(x, act, codes, scale16, minimum=None, minimum16=None):
    """Σ over 16-weight halves of (integer dot) · weight scale · activation scale, plus the
    offset terms (per 32, or per 16 as Q2_K's): the sum llama.cpp's dot products compute, up to
    float summation order."""
    q, dx, sx = _rounded_activations(x, act)
    n, k = codes.shape
    q16 = q.reshape(q.shape[0], -1, 16).astype(np.float64)
    dots = np.einsum("rhi,nhi->rnh", q16, codes.reshape(n, -1, 16).astype(np.float64))  # exact
    y = np.einsum("rnh,nh,rh->rn", dots, scale16, np.repeat(dx, 2, axis=-1))
    if minimum is not None:
        y += np.einsum("ng,rg->rn", minimum, sx)
    if minimum16 is not None:
        y += np.einsum("nh,rh->rn", minimum16, np.repeat(dx, 2, axis=-1) * q16.sum(-1))
    return y


def packed(q: np.ndarray) -> torch.Tensor:
    """Codes 0..15 as the 4-bit kernels take them (packed as the file packs Q4_0)."""
    return pack_nibbles(torch.from_numpy(q))


ISAS = pytest.mark.parametrize("isa", ["avx2", "native"])  # native: AVX-512 VNNI where present


@ISAS
@pytest.mark.parametrize("act", ["q8_0", "q8_1", "q8_k"])
def test_4_bit_blocks_times_rounded_activations_are_llama_cpps_sums(act, isa, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    rng = np.random.default_rng(0)
    n, k, rows = 40, 512, 5
    q = rng.integers(0, 16, (n, k))
    scale = rng.random((n, k // 32)).astype(np.float32) * 0.02
    minimum = (rng.random((n, k // 32)).astype(np.float32) - 0.5) * 0.1
    x = rng.standard_normal((rows, k)).astype(np.float32)
    layer = q4q8.Q4Q8Linear(packed(q), *(torch.from_numpy(t) for t in (scale, minimum)), act=act)
    ours = layer(torch.from_numpy(x)).double().numpy()
    expected = _expected(x, act, q, np.repeat(scale, 2, axis=-1), minimum)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


@ISAS
@pytest.mark.parametrize("k", [480, 512])  # 15 groups: the AVX2 path on every CPU
def test_q4_0_in_its_own_bits_is_llama_cpps_sum(k, isa, monkeypatch):
    """Q4_0 held as the file holds it (nibbles, float16 d: 4.5 bits) sums (q − 8)·d as
    llama.cpp's Q4_0 dot product does."""
    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    rng = np.random.default_rng(2)
    n, rows = 40, 5
    q = rng.integers(0, 16, (n, k))
    d = (rng.random((n, k // 32)) * 0.02).astype(np.float16)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    layer = q4q8.Q4S8Linear(packed(q), torch.from_numpy(d))
    assert layer.scale.dtype == torch.float16 and layer.packed.numel() == n * k // 2
    ours = layer(torch.from_numpy(x)).double().numpy()
    expected = _expected(x, "q8_0", q - 8, np.repeat(d.astype(np.float32), 2, axis=-1))
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


@ISAS
@pytest.mark.parametrize("k", [480, 512])  # 15 groups a row: the AVX2 path on every CPU
def test_2_3_5_8_and_6_bit_blocks_times_rounded_activations_are_llama_cpps_sums(k, isa, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    rng = np.random.default_rng(1)
    n, rows = 24, 6
    x = rng.standard_normal((rows, k)).astype(np.float32)
    q5 = rng.integers(0, 32, (n, k))
    d = rng.random((n, k // 32)).astype(np.float32) * 0.01
    ours = q4q8.Q5Q8Linear(torch.from_numpy(q5), torch.from_numpy(d))(torch.from_numpy(x))
    expected = _expected(x, "q8_0", q5 - 16, np.repeat(d, 2, axis=-1))
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)

    minimum = (rng.random((n, k // 32)).astype(np.float32) - 0.5) * 0.1  # Q5_1, Q5_K
    for act in ("q8_1",) + (("q8_k",) if k % 256 == 0 else ()):
        layer = q4q8.Q5Q8Linear(*(torch.from_numpy(t) for t in (q5, d, minimum)), act=act)
        expected = _expected(x, act, q5, np.repeat(d, 2, axis=-1), minimum)
        np.testing.assert_allclose(layer(torch.from_numpy(x)).double().numpy(), expected,
                                   rtol=1e-5, atol=1e-5)

    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    ours = q4q8.Q8Q8Linear(torch.from_numpy(codes), torch.from_numpy(d))(torch.from_numpy(x))
    expected = _expected(x, "q8_0", codes, np.repeat(d, 2, axis=-1))
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)

    if k % 256:
        return
    d256 = rng.random((n, k // 256)).astype(np.float32) * 1e-3

    def per_16(layer, codes, sub_scales, minimum16=None):  # the K-quants' scale per 16
        expected = _expected(x, "q8_k", codes, np.repeat(d256, 16, axis=-1) * sub_scales, None,
                             minimum16)
        np.testing.assert_allclose(layer(torch.from_numpy(x)).double().numpy(), expected,
                                   rtol=1e-5, atol=1e-5)

    codes3 = rng.integers(-4, 4, (n, k)).astype(np.int8)  # Q3_K
    sc3 = rng.integers(-32, 32, (n, k // 16)).astype(np.int8)
    per_16(q4q8.Q3Q8Linear(*(torch.from_numpy(t) for t in (codes3, sc3, d256))), codes3, sc3)

    q2 = rng.integers(0, 4, (n, k)).astype(np.uint8)  # Q2_K
    scale_bytes = rng.integers(0, 256, (n, k // 16)).astype(np.uint8)
    dmin = rng.random((n, k // 256)).astype(np.float32) * 1e-3
    per_16(q4q8.Q2Q8Linear(*(torch.from_numpy(t) for t in (q2, scale_bytes, d256, dmin))), q2,
           scale_bytes & 15, -np.repeat(dmin, 16, axis=-1) * (scale_bytes >> 4))

    codes6 = rng.integers(-32, 32, (n, k)).astype(np.int8)  # Q6_K
    sc6 = rng.integers(-128, 128, (n, k // 16)).astype(np.int8)
    per_16(q4q8.Q6Q8Linear(*(torch.from_numpy(t) for t in (codes6, sc6, d256))), codes6, sc6)


@ISAS
def test_scales_held_as_the_file_holds_them(isa, monkeypatch):
    """float16 scales (Q4_0, Q4_1, Q5_x, Q8_0) give bit for bit the float32 results; Q4_K's and
    Q5_K's 6-bit integers with d, dmin per 256 take llama.cpp's route (integer sums per 256,
    then one float multiply) to the same sums."""
    from localchat.formats.gguf_blocks import group_scales

    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    rng = np.random.default_rng(2)
    n, k, rows = 24, 512, 5
    x = rng.standard_normal((rows, k)).astype(np.float32)
    q4, q5 = (rng.integers(0, top, (n, k)) for top in (16, 32))
    f16 = [torch.from_numpy((rng.random((n, k // 32)) * 0.02).astype(np.float16)) for _ in "dm"]
    ints = [torch.from_numpy(rng.integers(0, 64, (n, k // 32)).astype(np.uint8)) for _ in "sm"]
    sup = torch.from_numpy((rng.random((n, k // 256, 2)) * 1e-3).astype(np.float32))
    for linear, q, codes in ((q4q8.Q4Q8Linear, q4, packed(q4)),
                             (q4q8.Q5Q8Linear, q5, torch.from_numpy(q5))):
        held, dense = f16 + [None], [t.float() for t in f16]
        ours = linear(codes, *held, act="q8_1")(torch.from_numpy(x))
        assert torch.equal(ours, linear(codes, *dense, act="q8_1")(torch.from_numpy(x)))
        scale, minimum = group_scales(*ints, sup)
        ours = linear(codes, *ints, sup, act="q8_k")(torch.from_numpy(x))
        expected = _expected(x, "q8_k", q, np.repeat(scale, 2, axis=-1), minimum)
        np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)
    codes = torch.from_numpy(rng.integers(-127, 128, (n, k)).astype(np.int8))
    x = torch.from_numpy(x)
    assert torch.equal(q4q8.Q8Q8Linear(codes, f16[0])(x), q4q8.Q8Q8Linear(codes, f16[0].float())(x))


def _assert_rows_batch_exactly(layer, x):
    """Each row's output bits alone, in batches of 1, 3, 4, 5 and 17 rows, at every position."""
    whole = layer(x)
    for rows in (1, 3, 4, 5, 17):
        assert torch.equal(layer(x[:rows]), whole[:rows])
    assert torch.equal(layer(x[3:8]), whole[3:8])
    for i in range(x.shape[0]):
        assert torch.equal(layer(x[i:i + 1]), whole[i:i + 1])


# N tails: 37 rows = 4 tiles of 8 and 5; 3 rows, less than a tile; AVX-512 holds two tiles a
# vector: 40 rows leave the 5th tile alone, 45 end in a pair of 8 and 5 rows
@ISAS
@pytest.mark.parametrize("n,k", [(40, 512), (37, 480), (3, 256), (45, 256)])
def test_q4_0_interleaved_by_8_rows_is_llama_cpps_sum_and_batches_exactly(n, k, isa, monkeypatch):
    """Q4_0 repacked 8 rows interleaved (4.5 bits, the last tile padded) sums (q − 8)·d as
    llama.cpp's Q4_0 dot product does, as q4s8 does up to float summation order."""
    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    rng = np.random.default_rng(3)
    q = rng.integers(0, 16, (n, k))
    d = (rng.random((n, k // 32)) * 0.02).astype(np.float16)
    x = rng.standard_normal((17, k)).astype(np.float32)
    layer = q4x8.Q4S8x8Linear(packed(q), torch.from_numpy(d))
    padded = -(-n // 8) * 8
    assert layer.codes.numel() + 2 * layer.scale.numel() == padded * k * 4.5 / 8
    ours = layer(torch.from_numpy(x))
    expected = _expected(x, "q8_0", q - 8, np.repeat(d.astype(np.float32), 2, axis=-1))
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)
    single = q4q8.Q4S8Linear(packed(q), torch.from_numpy(d))(torch.from_numpy(x))
    torch.testing.assert_close(ours, single, rtol=1e-6, atol=1e-6)
    _assert_rows_batch_exactly(layer, torch.from_numpy(x))


@ISAS
@pytest.mark.parametrize("n,k", [(40, 512), (37, 480), (3, 256)])
def test_q4_1_interleaved_by_8_rows_is_llama_cpps_sum_and_batches_exactly(n, k, isa, monkeypatch):
    """Q4_1 repacked 8 rows interleaved (5 bits: nibbles, float16 d and m, the last tile
    padded) sums q·d·dx + m·sx as llama.cpp's Q4_1 dot product does, as q4q8 does up to float
    summation order."""
    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    rng = np.random.default_rng(5)
    q = rng.integers(0, 16, (n, k))
    d = (rng.random((n, k // 32)) * 0.02).astype(np.float16)
    m = ((rng.random((n, k // 32)) - 0.5) * 0.1).astype(np.float16)
    x = rng.standard_normal((17, k)).astype(np.float32)
    held = [packed(q), *(torch.from_numpy(t) for t in (d, m))]
    layer = q4x8.Q41x8Linear(*held)
    padded = -(-n // 8) * 8
    assert layer.codes.numel() + 2 * layer.scale_offset.numel() == padded * k * 5 / 8
    ours = layer(torch.from_numpy(x))
    expected = _expected(x, "q8_1", q, np.repeat(d.astype(np.float32), 2, axis=-1),
                         m.astype(np.float32))
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)
    one_row_at_a_time = q4q8.Q4Q8Linear(*held, act="q8_1")(torch.from_numpy(x))
    torch.testing.assert_close(ours, one_row_at_a_time, rtol=1e-6, atol=1e-5)
    _assert_rows_batch_exactly(layer, torch.from_numpy(x))


@ISAS
@pytest.mark.parametrize("n,k", [(40, 512), (37, 512), (3, 256)])
def test_q4_k_interleaved_by_8_rows_is_llama_cpps_sum_and_batches_exactly(n, k, isa, monkeypatch):
    """Q4_K repacked 8 rows interleaved (4.75 bits) takes llama.cpp's route (integer sums per
    256 times the 6-bit scales, one float multiply by d·dx; the offsets alike) to its sums."""
    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    from localchat.formats.gguf_blocks import group_scales

    rng = np.random.default_rng(4)
    q = rng.integers(0, 16, (n, k))
    sc, m = (rng.integers(0, 64, (n, k // 32)).astype(np.uint8) for _ in "sm")
    sup = (rng.random((n, k // 256, 2)) * 1e-3).astype(np.float32)
    x = rng.standard_normal((17, k)).astype(np.float32)
    held = [packed(q), *(torch.from_numpy(t) for t in (sc, m, sup))]
    layer = q4x8.Q4Kx8Linear(*held)
    ours = layer(torch.from_numpy(x))
    scale, minimum = group_scales(sc, m, sup)
    expected = _expected(x, "q8_k", q, np.repeat(scale, 2, axis=-1), minimum)
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)
    one_row_at_a_time = q4q8.Q4Q8Linear(*held, act="q8_k")(torch.from_numpy(x))
    torch.testing.assert_close(ours, one_row_at_a_time, rtol=1e-6, atol=1e-5)
    _assert_rows_batch_exactly(layer, torch.from_numpy(x))


# N tails as above; "extreme": codes −32 or 31 (the first 8 rows all 31), sc −128 or 127,
# each activation row one value (all its codes ±127): the largest int16 pair sums there are
@ISAS
@pytest.mark.parametrize("n,k,values", [(40, 512, "random"), (37, 512, "random"),
                                        (3, 256, "random"), (45, 256, "random"),
                                        (16, 512, "extreme")])
def test_q6_k_interleaved_by_8_rows_is_llama_cpps_sum_and_batches_exactly(n, k, values, isa, monkeypatch):
    """Q6_K repacked 8 rows interleaved (6.625 bits, the last tile padded) takes llama.cpp's
    route (integer sums per 256 of Σ (q − 32)·x times the int8 sc, one float multiply by d·dx)
    to its sums, as q6q8 does up to float summation order."""
    monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", isa)
    rng = np.random.default_rng(5)
    if values == "extreme":
        codes = rng.choice(np.array([-32, 31], dtype=np.int8), (n, k))
        codes[:8] = 31
        sc = rng.choice(np.array([-128, 127], dtype=np.int8), (n, k // 16))
        x = np.repeat(rng.choice([-2.0, -1.0, 1.0, 3.0], (17, 1)), k, 1).astype(np.float32)
    else:
        codes = rng.integers(-32, 32, (n, k)).astype(np.int8)
        sc = rng.integers(-128, 128, (n, k // 16)).astype(np.int8)
        x = rng.standard_normal((17, k)).astype(np.float32)
    d = (rng.random((n, k // 256)) * 1e-3).astype(np.float32)
    held = [torch.from_numpy(t) for t in (codes, sc, d)]
    layer = q6x8.Q6Kx8Linear(*held)
    padded = -(-n // 8) * 8
    assert layer.blocks.numel() + layer.sub_scale.numel() + 4 * layer.scale.numel() == \
        padded * k * 6.625 / 8
    ours = layer(torch.from_numpy(x))
    expected = _expected(x, "q8_k", codes, np.repeat(d, 16, axis=-1) * sc)
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)
    one_row_at_a_time = q4q8.Q6Q8Linear(*held)(torch.from_numpy(x))
    torch.testing.assert_close(ours, one_row_at_a_time, rtol=1e-5, atol=1e-5)
    _assert_rows_batch_exactly(layer, torch.from_numpy(x))


@pytest.mark.skipif(q4q8.isa() != "avx512-vnni", reason="this CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("n", [8, 16, 37, 40, 45])
def test_the_8_row_kernels_return_the_same_bits_on_avx512_as_on_avx2(n, monkeypatch):
    """The interleaved tiles compiled for AVX-512 VNNI (16 rows a vector, vpdpbusd) and for
    AVX2 (8 rows, vpmaddubsw) sum the same integers: every output bit agrees, at every batch."""
    rng = np.random.default_rng(n)
    k = 512
    q = packed(rng.integers(0, 16, (n, k)))
    d, m = (torch.from_numpy((rng.random((n, k // 32)) * 0.02).astype(np.float16)) for _ in "dm")
    sc, mn = (torch.from_numpy(rng.integers(0, 64, (n, k // 32)).astype(np.uint8)) for _ in "sm")
    sup = torch.from_numpy((rng.random((n, k // 256, 2)) * 1e-3).astype(np.float32))
    six = [torch.from_numpy(rng.integers(-32, 32, (n, k)).astype(np.int8)),
           torch.from_numpy(rng.integers(-128, 128, (n, k // 16)).astype(np.int8)),
           torch.from_numpy((rng.random((n, k // 256)) * 1e-3).astype(np.float32))]
    layers = [q4x8.Q4S8x8Linear(q, d), q4x8.Q41x8Linear(q, d, m), q4x8.Q4Kx8Linear(q, sc, mn, sup),
              q6x8.Q6Kx8Linear(*six)]
    x = torch.from_numpy(rng.standard_normal((9, k)).astype(np.float32))
    for layer in layers:
        for rows in (1, 4, 9):
            monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", "avx2")
            narrow = layer(x[:rows])
            monkeypatch.setenv("LOCALCHAT_Q4Q8_ISA", "native")
            assert torch.equal(layer(x[:rows]), narrow), (type(layer).__name__, rows)


@pytest.mark.parametrize("four_bit", ["q4q8", "q41x8"])  # q41x8: Q4_1 8 rows interleaved
def test_the_model_on_q4q8_compiled_ahead_of_time_computes_what_llama_cpp_does(engine, four_bit,
                                                                              monkeypatch):
    """The bundled model with every matrix on q4q8 (or Q4_1's 8-row q41x8) and q8q8, its decode
    layers an AOTInductor artifact calling the ops, against llama.cpp on the same file: 64
    positions as chat runs them (prompt, then one token a step). Two implementations that
    round activations to 8 bits agree up to near-ties (measured on 1100 positions: 96.8-97.7 %
    top-1, mean |Δlogit| ~0.16; llama.cpp against its own float32 run 97.2 %); a broken kernel
    scores near 0."""
    from quantize.agreement import llama_cpp_logits, varied_text_tokens
    from localchat.engine.executors.torch.model import LlamaModel
    from localchat.engine.executors.torch.weights import load_weights
    from localchat.models.specs import resolve_model_facts

    facts = resolve_model_facts("default")
    tokens = varied_text_tokens(engine, 128)[:128]
    theirs = llama_cpp_logits(facts.path, tokens)[64:]
    monkeypatch.setattr(kernels, "KERNELS", tuple(kernels.BY_NAME[name] for name in
                                                  (four_bit, "q8q8", "f32")))
    chooser = kernels.KernelChooser(torch.device("cpu"))
    model = LlamaModel(load_weights(facts.path, chooser=chooser), 256, compiled=True)
    assert set(chooser.chosen.values()) == {four_bit, "q8q8"}
    ours = teacher_forced(model, torch.tensor(tokens), 64, warm=True)[64:]
    assert model.describe()["generated-token layers"] == "aotinductor"
    agree = (theirs.argmax(-1) == ours.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
    assert (theirs - ours).abs().mean().item() < 0.4
