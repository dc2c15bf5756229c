"""serve's defaults (engine/serving.py): the torch executor for the files its kernels run,
llama.cpp otherwise, and min(--max-queue, 16) llama.cpp slots within half the free memory."""

from __future__ import annotations

import gguf
import pytest

from localchat.engine import serving
from localchat.engine.config import EngineConfig
from localchat.engine.serving import SERVE_SLOTS, serving_config
from localchat.models.planner import engine_kv_bytes_per_token
from localchat.models.specs import resolve_model_facts
from helpers.tiny_files import write_tiny_gguf

FT = gguf.LlamaFileType
PLENTY = 1 << 40


@pytest.fixture
def avx2(monkeypatch):
    monkeypatch.setattr(serving, "has_avx2", lambda: True)
    monkeypatch.setattr("localchat.units.available_memory", lambda: PLENTY)


def _file(tmp_path, arch="llama", file_type=FT.MOSTLY_Q4_1):
    return str(write_tiny_gguf(tmp_path / f"{arch}-{file_type.name}.gguf", arch=arch,
                               file_type=file_type))


@pytest.mark.parametrize("file_type", [FT.MOSTLY_Q4_0, FT.MOSTLY_Q4_1, FT.MOSTLY_Q4_K_M,
                                       FT.MOSTLY_Q8_0, FT.MOSTLY_Q6_K, FT.MOSTLY_F16])
def test_llama_files_of_a_type_the_torch_kernels_run_are_served_on_torch(tmp_path, avx2,
                                                                         file_type):
    choice = serving_config(EngineConfig(model=_file(tmp_path, file_type=file_type)), 64)
    assert choice.config.engine == "torch" and choice.config.parallel is None
    name = file_type.name.removeprefix("MOSTLY_")
    assert choice.why == (f"chosen: its kernels run {name} llama files and batch requests "
                          "faster than the llama.cpp executor")


def test_llama_cpp_serves_what_torch_does_not_run_natively_with_enough_slots(tmp_path, avx2):
    gemma = serving_config(EngineConfig(model=_file(tmp_path, arch="gemma")), 64)
    assert (gemma.config.engine, gemma.config.parallel) == ("llama.cpp", SERVE_SLOTS)
    assert gemma.why == ("chosen: the torch executor does not run gemma models; "
                         f"{SERVE_SLOTS} KV slots")
    iq = serving_config(EngineConfig(model=_file(tmp_path, file_type=FT.MOSTLY_IQ4_XS)), 3)
    assert (iq.config.engine, iq.config.parallel) == ("llama.cpp", 3)  # no more than the queue
    assert iq.why == "chosen: the torch executor has no kernel of its own for IQ4_XS; 3 KV slots"


def test_llama_cpp_settings_or_no_avx2_keep_llama_cpp(tmp_path, avx2, monkeypatch):
    model = _file(tmp_path)
    asked = serving_config(EngineConfig(model=model, cache_type_k="f16"), 64)
    assert asked.config.engine == "llama.cpp"
    assert asked.why.startswith("chosen: llama.cpp's own settings are given (cache_type_k)")
    monkeypatch.setattr(serving, "has_avx2", lambda: False)
    plain = serving_config(EngineConfig(model=model), 64)
    assert plain.config.engine == "llama.cpp" and "need an x86-64 CPU with AVX2" in plain.why


def test_what_the_flags_say_is_kept(tmp_path, avx2):
    model = _file(tmp_path)
    for config in (EngineConfig(model=model, engine="llama.cpp", parallel=2),
                   EngineConfig(model=model, engine="torch")):
        choice = serving_config(config, 64)
        assert choice.config == config and choice.why == "as asked"
    asked = serving_config(EngineConfig(model=model, engine="llama.cpp"), 64)
    assert asked.config.parallel == SERVE_SLOTS and asked.why == f"as asked; {SERVE_SLOTS} KV slots"


def test_default_slots_stay_within_half_the_free_memory(tmp_path, avx2, monkeypatch):
    model = _file(tmp_path, arch="gemma")
    facts = resolve_model_facts(model)
    slot = engine_kv_bytes_per_token(facts, "llama.cpp") * 256  # its 256-token context
    monkeypatch.setattr("localchat.units.available_memory", lambda: 2 * 5 * slot + slot // 2)
    assert serving_config(EngineConfig(model=model), 64).config.parallel == 5
    monkeypatch.setattr("localchat.units.available_memory", lambda: 1)
    assert serving_config(EngineConfig(model=model), 64).config.parallel == 1
