"""GPTQ on one real layer of the bundled model: blk.0's q projection, with its real
inputs (the normed token embeddings of Python's docs) as calibration."""

from __future__ import annotations

import pytest
import torch

from localchat.models.gguf_reader import read_gguf
from localchat.models.specs import resolve_model
from quantize.export_hf import gguf_tensor
from localchat.formats.gptq import pack_v1
from quantize.gptq import _grid, _inverse_cholesky, _quant, gptq_quantize, hessian


@pytest.fixture(scope="module")
def layer():
    import llama_cpp
    from pydoc_data.topics import topics

    with read_gguf(resolve_model("default")) as g:
        emb, norm = gguf_tensor(g, "token_embd.weight"), gguf_tensor(g, "blk.0.attn_norm.weight")
        w = gguf_tensor(g, "blk.0.attn_q.weight")
    llm = llama_cpp.Llama(str(resolve_model("default")), vocab_only=True, verbose=False)
    tokens = llm.tokenize((topics["while"] + topics["global"]).encode(), add_bos=False)[:512]
    llm.close()
    x = torch.nn.functional.rms_norm(emb[tokens], (576,), norm, 1e-5).double()
    return w, x[:384], x[384:]


def rtn_asym(w: torch.Tensor, bits: int = 4, group_size: int = 128) -> torch.Tensor:
    """The same grid without error feedback: the baseline GPTQ has to beat."""
    maxq, out = 2 ** bits - 1, torch.empty_like(w)
    for g in range(0, w.shape[1], group_size):
        scale, zero = _grid(w[:, g:g + group_size], maxq)
        out[:, g:g + group_size] = _quant(w[:, g:g + group_size], scale[:, None], zero[:, None], maxq)[0]
    return out


def _output_error(w, q, x) -> float:
    """Σ ‖(W − Q) x‖² over the inputs: the Hessian-weighted error GPTQ minimises."""
    return (((w.double() - q.double()) @ x.t()) ** 2).sum().item()


@pytest.mark.model
def test_gptq_lowers_the_hessian_weighted_error_vs_rtn(layer):
    """Measured (4 bits, groups of 128, act-order, static groups): calibration inputs
    3.4 vs RTN 372; 128 held-out tokens 23 vs 120; the weights themselves move further
    (relative error 0.19 vs 0.12): GPTQ trades weight error for output error."""
    w, calib, held_out = layer
    result = gptq_quantize(w, hessian(calib), bits=4, group_size=128)
    rtn = rtn_asym(w, 4, 128)
    assert _output_error(w, result.dequantized, calib) < 0.1 * _output_error(w, rtn, calib)
    assert _output_error(w, result.dequantized, held_out) < 0.5 * _output_error(w, rtn, held_out)
    # codes, scales and zeros reproduce the dequantized weights
    s = result.scales[result.g_idx.long()].t()
    z = result.zeros[result.g_idx.long()].t()
    assert torch.allclose(s * (result.codes - z), result.dequantized, atol=1e-6)
    assert torch.equal(result.g_idx, (torch.arange(576) // 128).int())  # static groups


@pytest.mark.model
def test_v1_layout(layer):
    w, calib, _ = layer
    r = gptq_quantize(w, hessian(calib), bits=4, group_size=128)
    p = pack_v1(r)
    assert p["qweight"].dtype == torch.int32 and p["qweight"].shape == (576 // 8, 576)
    assert p["qzeros"].shape == (5, 576 // 8) and p["scales"].dtype == torch.float16
    q = p["qweight"].view(torch.uint32).to(torch.int64)
    unpacked = torch.stack([(q >> (4 * i)) & 15 for i in range(8)], dim=1).reshape(576, 576)
    assert torch.equal(unpacked.t(), r.codes.long())  # row k of qweight: input columns 8k..8k+7
    z = p["qzeros"].view(torch.uint32).to(torch.int64)
    zeros = torch.stack([(z >> (4 * i)) & 15 for i in range(8)], dim=2).reshape(5, 576)
    assert torch.equal(zeros + 1, r.zeros.long())  # v1 stores zero − 1


def test_damping_is_raised_until_cholesky_succeeds():
    h = torch.eye(8, dtype=torch.float64)
    h[0, 0] = -1e-4  # slightly indefinite: fails at 1e-6 damping, then 1e-5, 1e-4
    _, damp = _inverse_cholesky(h, percdamp=1e-6)
    assert damp > 1e-4
    with pytest.raises(ValueError, match="not positive definite"):
        _inverse_cholesky(-torch.eye(4, dtype=torch.float64), percdamp=1e-6, retries=2)


# -- the GPTQ v1 file layout and the torch engine's loader -----------------------------

def _loaded(packed: dict, prefix: str = "p."):
    from localchat.formats.gptq import GPTQConfig, load_gptq

    return load_gptq(lambda k: packed.get(k.removeprefix(prefix)), prefix, GPTQConfig(4, 128, 1))


@pytest.mark.model
def test_v1_round_trip_through_the_loader(layer):
    """pack_v1 -> the loader gives back the codes, zeros, scales and g_idx GPTQ chose, and
    exactly the weights GPTQ computed with (scales are float16 already in the algorithm)."""
    from localchat.formats.gptq import dequantize_gptq, sequential_group

    w, calib, _ = layer
    r = gptq_quantize(w, hessian(calib), bits=4, group_size=128)
    p = pack_v1(r)
    assert {k: (v.dtype, tuple(v.shape)) for k, v in p.items()} == {
        "qweight": (torch.int32, (72, 576)), "qzeros": (torch.int32, (5, 72)),
        "scales": (torch.float16, (5, 576)), "g_idx": (torch.int32, (576,))}
    m = _loaded(p)
    assert torch.equal(m.codes, r.codes) and torch.equal(m.zeros, r.zeros)
    assert torch.equal(m.scales, r.scales) and torch.equal(m.g_idx, r.g_idx.long())
    assert int(r.zeros.min()) >= 1  # v1 cannot store a zero of 0
    assert torch.equal(dequantize_gptq(m), r.dequantized)
    assert sequential_group(m) == 128  # static groups: no reordering needed


@pytest.mark.model
def test_zero_points_stay_storable_when_a_group_has_no_negative_weight(layer):
    """All-positive groups would get zero 0 on the min/max grid (stored as −1: 15, read
    back as 16 by v1 loaders); the grid moves to zero 1 and still spans the weights."""
    from localchat.formats.gptq import dequantize_gptq

    w, calib, _ = layer
    r = gptq_quantize(w.abs(), hessian(calib), bits=4, group_size=128)
    assert int(r.zeros.min()) == 1
    assert torch.equal(dequantize_gptq(_loaded(pack_v1(r))), r.dequantized)
    assert (r.dequantized - w.abs()).abs().max() < 2 * r.scales.max()


@pytest.mark.model
def test_int4_kernel_layer_matches_the_dequantized_weights(layer):
    """q/k/v fused into one Int4Linear (groups of 128 over rows of 576 run as kernel
    groups of 64) computes x @ Ŵᵀ; a permuted g_idx (act-order without static groups)
    falls back to a dense layer with the same weights."""
    from localchat.engine.executors.torch.gptq_weights import gptq_linear
    from localchat.formats.gptq import dequantize_gptq
    from localchat.engine.executors.torch.qlinear import DenseLinear, Int4Linear

    w, calib, held_out = layer
    h = hessian(calib)
    parts = [_loaded(pack_v1(gptq_quantize(m, h, 4, 128))) for m in (w, w[:192], w[192:384])]
    fused = gptq_linear(parts)
    assert isinstance(fused, Int4Linear) and fused.group == 64
    dense = torch.cat([dequantize_gptq(m) for m in parts])
    x = held_out[:16].float()
    assert torch.allclose(fused(x), x @ dense.t(), atol=0.05 * (x @ dense.t()).abs().max().item())
    shuffled = parts[0]
    shuffled.g_idx = shuffled.g_idx[torch.randperm(576, generator=torch.Generator().manual_seed(0))]
    assert isinstance(gptq_linear([shuffled]), DenseLinear)


@pytest.fixture(scope="module")
def gptq_two_layers(hf_dir, tmp_path_factory):
    """The bundled model's first 2 blocks, GPTQ on 4 × 128 tokens of calibration text."""
    from quantize.gptq_model import quantize_hf_dir_to_gptq

    torch.set_num_threads(2)
    return quantize_hf_dir_to_gptq(hf_dir, tmp_path_factory.mktemp("gptq") / "two-layers", 128,
                                   segments=4, seq_len=128, layers=2)


def test_written_directory_has_the_gptq_layout(gptq_two_layers):
    import json

    from safetensors import safe_open

    cfg = json.loads((gptq_two_layers / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    assert cfg["quantization_config"] | {"desc_act": True} == {
        "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False,
        "static_groups": True, "true_sequential": True, "damp_percent": 0.01,
        "checkpoint_format": "gptq"}
    assert (gptq_two_layers / "tokenizer.json").is_file()
    with safe_open(str(gptq_two_layers / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        p = "model.layers.1.mlp.down_proj."
        assert {p + s for s in ("qweight", "qzeros", "scales", "g_idx")} <= keys
        assert p + "weight" not in keys
        assert tuple(f.get_tensor(p + "qweight").shape) == (1536 // 8, 576)
        assert tuple(f.get_tensor("model.layers.0.self_attn.k_proj.qzeros").shape) == (5, 192 // 8)
        # embeddings and norms stay float (the embedding is tied: no lm_head)
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
        assert "model.layers.0.input_layernorm.weight" in keys
        assert not any(k.startswith("model.layers.2.") for k in keys)
    from localchat.models.specs import validate_model_path

    assert validate_model_path(gptq_two_layers).quant_type == "GPTQ-INT4-G128"


def test_written_model_loads_on_int4_kernels_and_generates(gptq_two_layers):
    from localchat.engine import EngineConfig, open_engine
    from localchat.engine.base import Message, Request, SamplingParams
    from localchat.engine.executors.torch.hf_weights import load_hf_weights
    from localchat.engine.executors.torch.qlinear import Int4Linear

    w = load_hf_weights(gptq_two_layers)
    assert all(isinstance(getattr(layer, f), Int4Linear) for layer in w.layers
               for f in ("wqkv", "wo", "w_gate_up", "w_down"))
    eng = open_engine(EngineConfig(str(gptq_two_layers), engine="torch", ctx_size=256, threads=2,
                      kv_memory=512 * 23040))
    try:
        reply = eng.complete(Request(messages=[Message("user", "What is the capital of France?")],
                                     sampling=SamplingParams(temperature=0.0), max_tokens=8))
    finally:
        eng.close()
    assert reply.stats.completion_tokens > 0  # two blocks of 30: text, not sense


def test_eval_reads_gptq_matrices(gptq_two_layers, hf_dir):
    """quantize/file_matrices (eval's matrix errors) dequantizes GPTQ files."""
    from localchat.models.specs import validate_model_path
    from quantize.file_matrices import projection_matrices

    matrices, bits = projection_matrices(validate_model_path(gptq_two_layers))
    assert len(matrices) == 14 and 4.1 < bits < 4.5  # codes + float16 scales + zeros + g_idx
    from safetensors import safe_open

    name = "model.layers.1.mlp.down_proj.weight"
    with safe_open(str(hf_dir / "model.safetensors"), "pt") as f:
        ref = f.get_tensor(name)
    assert (matrices[name] - ref).norm() / ref.norm() < 0.25


def test_quantize_cli_refuses_gptq_for_other_types(tmp_path, capsys):
    from localchat.cli import main

    assert main(["quantize", "default", "-o", str(tmp_path / "x"), "--type", "nf4",
                 "--method", "gptq"]) != 0
    assert "--type int4" in capsys.readouterr().err
    assert main(["quantize", "default", "-o", str(tmp_path / "x"), "--type", "int4",
                 "--calibration", "notes.txt"]) != 0
    assert "--method gptq" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_calibration_text_is_disjoint_from_the_eval_text():
    from quantize.gptq_model import SEGMENT_TOKENS, SEGMENTS, calibration_text
    from quantize.quality import default_text

    text, calib = default_text(), calibration_text()
    # eval scores the start; 32 segments of 512 tokens need < 4 chars a token of the tail
    assert text.endswith(calib) and len(text) - len(calib) > 250_000
    assert len(calib) > 4 * SEGMENTS * SEGMENT_TOKENS


@pytest.mark.slow
def test_gptq_whole_bundled_model_through_the_cli(tmp_path):
    """~2 min here: the full `localchat quantize default --type int4 --method gptq`."""
    from localchat.cli import main
    from localchat.engine.executors.torch.hf_weights import load_hf_weights

    out = tmp_path / "gptq"
    assert main(["quantize", "default", "-o", str(out), "--type", "int4", "--method", "gptq"]) == 0
    assert len(load_hf_weights(out).layers) == 30


def test_calibration_file_is_tokenized_into_segments(hf_dir, tmp_path):
    from localchat.errors import UsageError
    from quantize.gptq_model import calibration_tokens

    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    tokens = calibration_tokens(hf_dir, str(text), segments=4, seq_len=256)
    assert tokens.shape == (4, 256) and tokens.dtype == torch.int64
    text.write_text("too short", encoding="utf-8")
    with pytest.raises(UsageError, match="calibration text has"):
        calibration_tokens(hf_dir, str(text))
    with pytest.raises(UsageError, match="cannot read --calibration"):
        calibration_tokens(hf_dir, str(tmp_path / "missing.txt"))
