"""Hugging Face safetensors directories (float, NF4, INT8/INT4, GPTQ) -> the torch engine's
config and layers. Every tensor is checked against config.json first, so a bad file is a
one-line EngineError naming the tensor, never a shape error mid-forward."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from localchat.engine.executors.torch.gptq_weights import gptq_linear
from localchat.engine.executors.torch.intq import int_linear
from localchat.engine.executors.torch.kernels import KernelChooser
from localchat.engine.executors.torch.qlinear import DenseLinear, NF4Linear
from localchat.engine.executors.torch.rope import llama3_rope_factors
from localchat.engine.executors.torch.weights import LayerWeights, LlamaConfig, ModelWeights
from localchat.errors import EngineError
from localchat.formats.gptq import QUANT_METHOD as GPTQ_METHOD
from localchat.formats.gptq import GPTQMatrix, dequantize_gptq, gptq_config, load_gptq
from localchat.formats.intq import QUANT_METHOD, SCALE_SUFFIX, IntMatrix, dequantize_int, load_int
from localchat.formats.nf4 import QUANT_STATE_KEY, dequantize, load_nf4, stack_nf4
from localchat.models.hf_files import HF_MODEL_TYPES, read_json, safetensors_files

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def hf_llama_config(cfg: dict, name: str) -> tuple[LlamaConfig, torch.Tensor | None]:
    """config.json -> (LlamaConfig, Llama 3.1 RoPE divisors or None)."""
    model_type = cfg.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise EngineError(f"{name}: the torch engine runs {', '.join(HF_MODEL_TYPES)} models, "
                          f"not model_type {model_type!r}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise EngineError(f"{name}: activation {cfg.get('hidden_act')!r} is not supported (silu only)")
    if cfg.get("mlp_bias"):
        raise EngineError(f"{name}: MLP biases (mlp_bias) are not supported")
    if model_type == "qwen2" and cfg.get("use_sliding_window"):
        raise EngineError(f"{name}: sliding-window attention is not supported")

    def num(key: str, default=None, kind=int):
        value = cfg.get(key, default)
        if kind is int and (type(value) is not int or value <= 0) or \
                kind is float and (not isinstance(value, (int, float)) or value <= 0):
            raise EngineError(f"{name}/config.json: {key} must be a positive number, got {value!r}")
        return kind(value)

    n_heads, dim = num("num_attention_heads"), num("hidden_size")
    head_dim = cfg.get("head_dim") or dim // n_heads
    base = num("rope_theta", 10000.0, float)
    scale, freqs = 1.0, None
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "linear":
            scale = 1.0 / float(scaling["factor"])
        elif kind == "llama3":
            freqs = llama3_rope_factors(
                head_dim, base, float(scaling["factor"]), float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))
        elif kind != "default":
            raise EngineError(f"{name}: RoPE scaling {kind!r} is not supported by the torch "
                              "engine (supported: linear, llama3)")
    elif scaling is not None:
        raise EngineError(f"{name}/config.json: rope_scaling must be an object or null")
    config = LlamaConfig(
        arch=model_type, n_layers=num("num_hidden_layers"), dim=dim,
        ffn_dim=num("intermediate_size"), n_heads=n_heads,
        n_kv_heads=num("num_key_value_heads", n_heads), head_dim=head_dim,
        vocab_size=num("vocab_size"), context_length=num("max_position_embeddings"),
        rope_base=base, norm_eps=num("rms_norm_eps", 1e-6, float), rope_neox=True,
        rope_position_scale=scale)
    return config, freqs


class _Tensors:
    """Every tensor of the directory's safetensors files, by name, read on demand."""

    def __init__(self, directory: Path, stack: ExitStack, int_bits: int | None = None,
                 int_group: int | None = None, gptq=None,
                 chooser: KernelChooser | None = None) -> None:
        self.name = directory.name
        self.chooser = chooser or KernelChooser(torch.device("cpu"))
        self.int_bits, self.int_group = int_bits, int_group  # localchat-int files
        self.gptq = gptq  # GPTQConfig for GPTQ checkpoints
        self.where: dict[str, object] = {}
        for path in safetensors_files(directory):
            try:
                handle = stack.enter_context(safe_open(str(path), framework="pt"))
            except Exception as e:  # safetensors raises its own SafetensorError
                raise EngineError(f"cannot read {path.name}: {e}") from None
            for key in handle.keys():
                if key in self.where:
                    raise EngineError(f"{self.name}: tensor {key} is stored twice")
                self.where[key] = handle

    def get(self, key: str) -> torch.Tensor | None:
        handle = self.where.get(key)
        return None if handle is None else handle.get_tensor(key)

    def dense(self, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        t = self.get(key)
        if t is None:
            raise EngineError(f"{self.name} lacks tensor {key}")
        if t.dtype not in FLOAT_DTYPES:
            raise EngineError(f"{self.name}: tensor {key} has type {t.dtype}, not a float type")
        if tuple(t.shape) != shape:
            raise EngineError(f"{self.name}: tensor {key} has shape {list(t.shape)}, "
                              f"config.json says {list(shape)}")
        return t.float()

    def matrix(self, key: str, shape: tuple[int, int]):
        """A weight as an NF4Matrix (if stored as NF4 with whole-row blocks), an IntMatrix
        (localchat INT8/INT4), a GPTQMatrix or float32."""
        prefix = key.removesuffix("weight")
        if self.gptq is not None and prefix + "qweight" in self.where:
            m = load_gptq(self.get, prefix, self.gptq)
        elif self.int_bits and key + SCALE_SUFFIX in self.where:
            m = load_int(self.get, key, self.int_bits, self.int_group)
        elif key + "." + QUANT_STATE_KEY not in self.where:
            return self.dense(key, shape)
        else:
            m = load_nf4(self.get, key)
        got = tuple(m.shape)
        if got != shape:
            raise EngineError(f"{self.name}: tensor {key} has shape {list(got)}, "
                              f"config.json says {list(shape)}")
        return m

    def linear(self, keys: list[str], shapes: list[tuple[int, int]]) -> torch.nn.Module:
        """One layer for matrices stacked by rows: NF4 or INT when all are, else float32."""
        parts = [self.matrix(k + ".weight", s) for k, s in zip(keys, shapes)]
        if all(isinstance(p, IntMatrix) for p in parts):
            return int_linear(parts, self.chooser, keys[0].rsplit(".", 1)[-1])
        if all(isinstance(p, GPTQMatrix) for p in parts):
            return gptq_linear(parts)
        if all(not isinstance(p, (torch.Tensor, IntMatrix, GPTQMatrix)) for p in parts):
            return NF4Linear(stack_nf4(parts))
        return DenseLinear(torch.cat([
            p if isinstance(p, torch.Tensor) else
            dequantize_int(p) if isinstance(p, IntMatrix) else
            dequantize_gptq(p) if isinstance(p, GPTQMatrix) else dequantize(p) for p in parts]))


def load_hf_weights(directory: Path, chooser: KernelChooser | None = None) -> ModelWeights:
    """The model in `directory`, on the CPU; INT layers on the kernels `chooser` picks."""
    directory = Path(directory)
    cfg = read_json(directory / "config.json")
    config, rope_freqs = hf_llama_config(cfg, directory.name)
    c = config
    q_rows, kv_rows = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    q = cfg.get("quantization_config")
    is_int = isinstance(q, dict) and q.get("quant_method") == QUANT_METHOD
    int_bits, int_group = (q.get("bits"), q.get("group_size")) if is_int else (None, None)
    if is_int and (int_bits not in (4, 8) or not (int_group is None or
                                                  type(int_group) is int and int_group > 0)):
        raise EngineError(f"{directory.name}: bad {QUANT_METHOD} quantization_config {q}")
    gptq = gptq_config(q, directory.name) if isinstance(q, dict) and \
        q.get("quant_method") == GPTQ_METHOD else None
    with ExitStack() as stack:
        t = _Tensors(directory, stack, int_bits, int_group, gptq, chooser)
        with_bias = c.arch == "qwen2" or bool(cfg.get("attention_bias"))

        def layer(i: int) -> LayerWeights:
            p = f"model.layers.{i}"
            attn = [f"{p}.self_attn.{x}_proj" for x in "qkv"]
            if f"{p}.self_attn.o_proj.bias" in t.where:
                raise EngineError(f"{directory.name}: output-projection biases are not supported")
            return LayerWeights(
                attn_norm=t.dense(f"{p}.input_layernorm.weight", (c.dim,)),
                wqkv=t.linear(attn, [(q_rows, c.dim), (kv_rows, c.dim), (kv_rows, c.dim)]),
                bqkv=torch.cat([t.dense(f"{a}.bias", (n,)) for a, n in
                                zip(attn, (q_rows, kv_rows, kv_rows))]) if with_bias else None,
                wo=t.linear([f"{p}.self_attn.o_proj"], [(c.dim, q_rows)]),
                ffn_norm=t.dense(f"{p}.post_attention_layernorm.weight", (c.dim,)),
                w_gate_up=t.linear([f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"],
                                   [(c.ffn_dim, c.dim)] * 2),
                w_down=t.linear([f"{p}.mlp.down_proj"], [(c.dim, c.ffn_dim)]),
            )

        embedding = t.dense("model.embed_tokens.weight", (c.vocab_size, c.dim))
        layers = [layer(i) for i in range(c.n_layers)]
        tied = cfg.get("tie_word_embeddings", False) is True  # transformers' default: untied
        output = DenseLinear(embedding) if tied else \
            t.linear(["lm_head"], [(c.vocab_size, c.dim)])
        norm = t.dense("model.norm.weight", (c.dim,))
    return ModelWeights(config, embedding, layers, norm, output, rope_freqs)
