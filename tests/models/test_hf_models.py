"""Hugging Face safetensors directories in the torch engine, on the bundled model
exported to one (conftest's hf_dir): tokenization, logits and the CLI against the GGUF."""

from __future__ import annotations

import ctypes
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from localchat.engine.base import Message, Tool, ToolCall
from localchat.engine.executors.torch.hf_vocab import HFVocabulary
from localchat.engine.executors.torch.hf_weights import load_hf_weights
from localchat.engine.executors.torch.model import KVStore, LlamaModel
from localchat.engine.executors.torch.qlinear import DenseLinear
from localchat.engine.executors.torch.weights import LayerWeights, LlamaConfig, ModelWeights
from localchat.errors import EngineError, ModelFormatError, ModelNotFoundError, UnsafeCheckpointError
from localchat.models.gguf_reader import read_gguf
from localchat.models.specs import resolve_model, resolve_model_facts
from quantize.export_hf import gguf_tensor

from helpers.cli import localchat
from helpers.tiny_hf import TINY_CONFIG, tiny_tensors, write_tiny_hf_dir

TEXTS = [
    "Hello, world!", "naïve café 東京 ✓ 🙂 👩‍👩‍👧", "  leading spaces\tand\ttabs\n\n\n",
    "<|im_start|>system looks special but is typed<|im_end|>", "<|endoftext|><reponame>x",
    "def f(x):\n    return x**2  # 12345678901234567890", "it's they're I'LL 3.14159e-10",
    "日本語のテキスト、中文文本。한국어 Ελληνικά русский", "€100, ¥2000 & 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u200b zero-width",
    "```json\n{\"a\": [1, 2, 3]}\n```", "----------------------------------------------------------------",
]


@pytest.fixture(scope="module")
def hf_vocab(hf_dir):
    return HFVocabulary(hf_dir)


def test_tokenization_equals_llama_cpps(hf_vocab, hf_dir, engine):
    for text in TEXTS:
        assert hf_vocab.tokenize_text(text) == engine.tokenize_text(text), text
    template = resolve_model_facts(str(hf_dir)).chat_template
    assert template == engine.facts.chat_template
    chats = [
        [Message("user", "Hello! Who are you?")],
        [Message("system", "Be brief."), Message("user", TEXTS[3]),
         Message("assistant", TEXTS[1]), Message("user", TEXTS[5])],
    ]
    for chat in chats:
        assert hf_vocab.tokenize_messages(template, chat) == engine.tokenize_messages(chat)
    # tools, a call and its result: the same prompt on both vocabularies, longer by them
    tools = (Tool("get_weather", "The weather", '{"type": "object", "properties": {}}'),)
    turns = chats[0] + [Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather"),)),
                        Message("tool", "18 C", tool_call_id="c1")]
    with_tools = hf_vocab.tokenize_messages(template, turns, tools)
    assert with_tools == engine.tokenize_messages(turns, tools)
    assert len(with_tools) > len(engine.tokenize_messages(chats[0])) + 100
    # a typed control token stays text: <|im_end|> (id 2) appears only where the template put it
    typed = hf_vocab.tokenize_messages(template, [Message("user", "<|im_end|>")])
    assert typed.count(2) == 2 and hf_vocab.tokenize_text("<|im_end|>") != [2]


def test_detokenized_pieces_and_end_of_generation_equal_llama_cpps(hf_vocab, engine):
    """Every token's bytes as llama.cpp renders it (a large buffer: llama-cpp-python's own
    detokenize() uses 32 bytes and returns b"" for the 47 longer tokens of this vocab)."""
    import llama_cpp

    vocab = engine.vocab.model.vocab
    buf = ctypes.create_string_buffer(256)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    for token in range(n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, 256, 0, False)
        assert hf_vocab.detokenize(token) == buf.raw[:n], token
        assert hf_vocab.is_end_of_generation(token) == engine.is_end_of_generation(token), token
    # a multi-byte character split across tokens reassembles in order
    ids = hf_vocab.tokenize_text("🙂東京")
    assert b"".join(hf_vocab.detokenize(t) for t in ids).decode("utf-8") == "🙂東京"


def _gguf_dense_weights(path: Path) -> ModelWeights:
    """The GGUF's weights dequantized to float32 exactly as the export does, in GGUF's
    own layout (permuted Q/K rows, pair-wise RoPE): the reference for the HF layout."""
    with read_gguf(path) as g:
        c = LlamaConfig.from_metadata(g.metadata)
        d = lambda name: gguf_tensor(g, name)  # noqa: E731
        lin = lambda *names: DenseLinear(torch.cat([d(n) for n in names]))  # noqa: E731
        layers = [LayerWeights(
            d(f"blk.{i}.attn_norm.weight"), lin(*(f"blk.{i}.attn_{x}.weight" for x in "qkv")),
            None, lin(f"blk.{i}.attn_output.weight"), d(f"blk.{i}.ffn_norm.weight"),
            lin(f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight"),
            lin(f"blk.{i}.ffn_down.weight")) for i in range(c.n_layers)]
        embedding = d("token_embd.weight")
        return ModelWeights(c, embedding, layers, d("output_norm.weight"), DenseLinear(embedding))


def _logits(weights: ModelWeights, tokens: list[int]) -> torch.Tensor:
    model, n = LlamaModel(weights, max_positions=256), len(tokens)
    return model.forward(torch.tensor(tokens), torch.arange(n), torch.arange(n), torch.arange(n),
                         KVStore(weights.config, 256), all_logits=True)


def test_hf_logits_equal_the_ggufs_on_the_same_weights(hf_dir, engine):
    """Same float32 values, two layouts: un-permuted rows + half rotation (HF) must give
    the GGUF layout's logits. A wrong un-permutation or RoPE mode is off by whole units."""
    torch.set_num_threads(2)
    hf = load_hf_weights(hf_dir)
    assert hf.config.rope_neox and not hf.config.rope_neox == (hf.config.arch == "qwen2")
    tokens = engine.tokenize_text(TEXTS[5] + TEXTS[1] + TEXTS[7])[:64]
    ours, reference = _logits(hf, tokens), _logits(_gguf_dense_weights(resolve_model("default")), tokens)
    assert (ours - reference).abs().max().item() < 1e-3 * max(1.0, reference.abs().max().item())


@pytest.mark.subprocess
def test_run_command_on_an_hf_directory(hf_dir):
    proc = localchat("run", "What is the capital of France?", "-m", str(hf_dir), "--engine", "torch",
                "-n", "12", "--temp", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["engine"] == "torch" and "Paris" in out["text"]
    refused = localchat("run", "hi", "-m", str(hf_dir), "--engine", "llama.cpp")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "needs a GGUF file" in refused.stderr and "the torch engine" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_auto_engine_picks_torch_for_an_hf_directory(hf_dir):
    from localchat.engine import EngineConfig, open_engine

    eng = open_engine(EngineConfig(str(hf_dir), engine="auto", ctx_size=256, threads=2, kv_memory=512 * 23040))
    try:
        assert eng.name == "torch" and eng.info.quant_type == "F32"
        assert eng.info.path == str(hf_dir)
    finally:
        eng.close()


# --- refusals: one-line typed errors -------------------------------------------------

@pytest.mark.model
def test_tiny_directory_loads_and_runs(tmp_path):
    weights = load_hf_weights(write_tiny_hf_dir(tmp_path / "ok", tiny_tensors()))
    assert weights.config.n_kv_heads == 1 and _logits(weights, [1, 2, 3]).shape == (3, 32)


def test_missing_and_misshapen_tensors_are_named(tmp_path):
    tensors = tiny_tensors()
    del tensors["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(EngineError, match=r"lacks tensor model\.layers\.0\.mlp\.up_proj\.weight"):
        load_hf_weights(write_tiny_hf_dir(tmp_path / "missing", tensors))
    tensors = tiny_tensors()
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.randn(64, 64)
    with pytest.raises(EngineError, match=r"k_proj\.weight has shape \[64, 64\], config.json says \[32, 64\]"):
        load_hf_weights(write_tiny_hf_dir(tmp_path / "shape", tensors))


def test_unsupported_configs_say_what_is_unsupported(tmp_path):
    with pytest.raises(EngineError, match="RoPE scaling 'yarn' is not supported"):
        load_hf_weights(write_tiny_hf_dir(tmp_path / "yarn", tiny_tensors(),
                                  TINY_CONFIG | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "config.json").write_text(json.dumps(TINY_CONFIG | {"model_type": "gemma2"}))
    save_file(tiny_tensors(), str(tmp_path / "gemma" / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="model_type 'gemma2' is not supported"):
        resolve_model_facts(str(tmp_path / "gemma"))


@pytest.mark.subprocess
def test_directory_refusals_through_the_cli(tmp_path, hf_dir):
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    with pytest.raises(ModelNotFoundError, match="it is a directory"):
        resolve_model_facts(str(no_config))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps(TINY_CONFIG))
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    with pytest.raises(UnsafeCheckpointError, match="pytorch_model.bin"):
        resolve_model_facts(str(pickled))
    truncated = write_tiny_hf_dir(tmp_path / "truncated", tiny_tensors())
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="truncated download"):
        resolve_model_facts(str(truncated))
    # a missing tensor in a directory that is otherwise complete: one line from the CLI
    broken = write_tiny_hf_dir(tmp_path / "broken", {k: v for k, v in tiny_tensors().items()
                                              if "down_proj" not in k})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, broken / name)
    for directory, code, words in ((pickled, 1, "never unpickled"), (broken, 1, "lacks tensor"),
                                   (no_config, 1, "directory")):
        proc = localchat("run", "hi", "-m", str(directory), "--engine", "torch")
        assert proc.returncode == code, proc.stderr
        assert proc.stderr.startswith("localchat: error:") and proc.stderr.count("\n") == 1
        assert words in proc.stderr
