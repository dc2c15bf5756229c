"""`bench --peer`: llama-bench's JSON (a recorded real output), the runs we ask of it, the
ratios, the errors through the real CLI, and the real peer where $LOCALCHAT_LLAMA_BENCH
names one (CI builds no peer: skipped there)."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, localchat
from helpers.tiny_files import write_tiny_gguf
from localchat.bench.peer import (PEER_ENV, PeerSetting, parse_rows, peer_command,
                                  peer_ratios, peer_settings)
from localchat.bench.peer import format_peer

# real llama-bench output (a native build of llama-cpp-python 0.3.36's llama.cpp, on the
# bundled model): the two runs peer_command makes for -p 16 -g 8 -r 3 -t 2, K q8_0 / V f16
SAMPLE = Path(__file__).parent / "llama_bench_sample.json"
OURS = PeerSetting("q8_0", "f16", "as our llama.cpp executor")
PEER = os.environ.get(PEER_ENV)
needs_peer = pytest.mark.skipif(not PEER, reason=f"${PEER_ENV} names no llama-bench")


def sample_peer() -> dict:
    runs = json.loads(SAMPLE.read_text())["runs"]
    rows = [row for run in runs for row in parse_rows(json.dumps(run), OURS)]
    return {"binary": "/x/llama-bench", "build": f"b{rows[0]['build_number']} (abc)",
            "cpu_info": rows[0]["cpu_info"], "backends": rows[0]["backends"],
            "settings": {"threads": 2, "repeats": 3, "flash_attn": "on", "depth": 16,
                         "cache_types": {OURS.key: OURS.label}},
            "rows": rows}


def test_peer_prefills_from_an_empty_context_and_decodes_at_the_prompts_depth():
    pp, tg = peer_command(Path("/b/llama-bench"), Path("/m.gguf"), OURS, prompt=512, gen=128,
                          repeats=5, threads=2)

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1]

    assert [flag(pp, f) for f in ("-p", "-n", "-d")] == ["512", "0", "0"]
    assert [flag(tg, f) for f in ("-p", "-n", "-d")] == ["0", "128", "512"]
    for cmd in (pp, tg):
        assert [flag(cmd, f) for f in ("-m", "-r", "-t", "-ctk", "-ctv", "-fa", "-o")] == \
            ["/m.gguf", "5", "2", "q8_0", "f16", "on", "json"]


def test_peer_runs_our_cache_types_and_llama_benchs_default_once_each():
    assert [s.key for s in peer_settings(("q8_0", "f16"))] == ["q8_0/f16", "f16/f16"]
    assert [s.key for s in peer_settings(("f16", "f16"))] == ["f16/f16"]


def test_recorded_llama_bench_json_becomes_prefill_and_decode_rows():
    prefill, decode = sample_peer()["rows"]
    assert (prefill["kind"], prefill["test"]) == ("prefill", "pp16")
    assert (prefill["n_prompt"], prefill["n_gen"], prefill["n_depth"]) == (16, 0, 0)
    assert (decode["kind"], decode["test"]) == ("decode", "tg8 @ d16")
    assert (decode["n_prompt"], decode["n_gen"], decode["n_depth"]) == (0, 8, 16)
    for row in (prefill, decode):
        assert row["avg_ts"] == pytest.approx(statistics.mean(row["samples_ts"]), rel=1e-3)
        assert len(row["samples_ts"]) == 3
        assert (row["type_k"], row["type_v"], row["cache"]) == ("q8_0", "f16", "q8_0/f16")
        assert row["build_number"] >= 0 and row["build_commit"] and row["cpu_info"]


def test_not_json_or_no_test_is_an_engine_error():
    from localchat.errors import EngineError

    with pytest.raises(EngineError, match="printed no JSON"):
        parse_rows("| model | size |", OURS)
    with pytest.raises(EngineError, match="holds no test"):
        parse_rows("[]", OURS)


def test_ratios_are_our_medians_over_the_peers_means_and_the_table_says_so():
    peer = sample_peer()
    prefill, decode = peer["rows"]
    engines = {"llama.cpp": {"prefill_tok_s": 100.0, "decode_tok_s": 40.0}}
    peer["ratios"] = peer_ratios(engines, peer)
    assert peer["ratios"]["llama.cpp"]["q8_0/f16"] == {
        "prefill": pytest.approx(100.0 / prefill["avg_ts"]),
        "decode": pytest.approx(40.0 / decode["avg_ts"])}
    table = format_peer({"peer": peer})
    assert f"llama-bench b{prefill['build_number']} (abc) at /x/llama-bench" in table
    assert "K/V q8_0/f16 (as our llama.cpp executor)" in table
    assert f"{decode['avg_ts']:.1f} ± {decode['stddev_ts']:.1f}" in table
    assert "decode tg8 @ d16 tok/s" in table
    assert (f"llama.cpp / llama-bench: K/V q8_0/f16: prefill {100 / prefill['avg_ts']:.2f}x, "
            f"decode {40 / decode['avg_ts']:.2f}x") in table


@pytest.mark.subprocess
def test_a_missing_peer_is_one_line():
    assert_one_line_error(localchat("bench", "--engines", "", "--peer", "/no/llama-bench"),
                          "--peer: /no/llama-bench is not a file")


@pytest.mark.subprocess
def test_a_peer_that_is_not_executable_is_one_line(tmp_path):
    path = tmp_path / "llama-bench"
    path.write_text("#!/bin/sh\n")
    assert_one_line_error(localchat("bench", "--engines", "", "--peer", str(path)),
                          "is not executable")


@pytest.mark.subprocess
def test_no_peer_given_found_nowhere_is_one_line(tmp_path):
    env = {PEER_ENV: "", "PATH": str(tmp_path)}  # an empty directory: no llama-bench on it
    proc = localchat("bench", "--engines", "", "--peer", env_extra=env)
    assert_one_line_error(proc, f"no llama-bench given, none in ${PEER_ENV}")


@pytest.mark.subprocess
def test_a_hugging_face_directory_has_no_peer(tmp_path):
    from helpers.tiny_hf import tiny_tensors, write_tiny_hf_dir

    hf = write_tiny_hf_dir(tmp_path / "tiny", tiny_tensors(), with_tokenizer=True)
    proc = localchat("bench", "-m", str(hf), "--engines", "torch", "--peer", "/bin/true")
    assert_one_line_error(proc, "--peer needs a GGUF file", "a Hugging Face directory")


@pytest.mark.subprocess
def test_a_failing_peer_shows_its_exit_status_and_last_stderr_line(tmp_path):
    path = tmp_path / "llama-bench"
    path.write_text("#!/bin/sh\necho 'loading' >&2\necho 'main: error: no model' >&2\nexit 3\n")
    path.chmod(0o755)
    proc = localchat("bench", "--engines", "", "-p", "16", "-g", "8", "-r", "1",
                     "--peer", str(path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "localchat: error: llama-bench failed (exit 3): main: error: no model"


@pytest.mark.subprocess
def test_peer_is_for_the_speed_task():
    assert_one_line_error(localchat("bench", "--task", "json", "--peer", "/bin/true"),
                          "--peer compares prefill and decode")


@pytest.mark.subprocess
@needs_peer
@pytest.mark.slow
def test_the_real_peer_beside_our_llama_cpp_engine():
    proc = localchat("bench", "--engines", "llama.cpp", "-p", "16", "-g", "8", "-r", "1",
                     "-c", "512", "-t", "2", "--json", "--peer", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    peer = report["peer"]
    assert peer["binary"] == str(Path(PEER).resolve())
    assert peer["build_number"] >= 0 and peer["build_commit"] and peer["cpu_info"]
    assert peer["settings"]["cache_types"] == {"q8_0/f16": "as our llama.cpp executor",
                                               "f16/f16": "llama-bench's default"}
    shapes = {(r["cache"], r["kind"]): (r["n_prompt"], r["n_gen"], r["n_depth"], r["type_k"],
                                        r["n_threads"], len(r["samples_ts"]))
              for r in peer["rows"]}
    assert shapes == {("q8_0/f16", "prefill"): (16, 0, 0, "q8_0", 2, 1),
                      ("q8_0/f16", "decode"): (0, 8, 16, "q8_0", 2, 1),
                      ("f16/f16", "prefill"): (16, 0, 0, "f16", 2, 1),
                      ("f16/f16", "decode"): (0, 8, 16, "f16", 2, 1)}
    ours = report["engines"]["llama.cpp"]
    for r in peer["rows"]:
        assert r["avg_ts"] > 0 and r["flash_attn"] in (1, True)
        assert peer["ratios"]["llama.cpp"][r["cache"]][r["kind"]] == \
            pytest.approx(ours[f"{r['kind']}_tok_s"] / r["avg_ts"])


@pytest.mark.subprocess
@needs_peer
def test_the_real_peer_failing_on_a_file_it_cannot_load(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf")  # metadata, but no layers to load
    proc = localchat("bench", "-m", str(model), "--engines", "", "-p", "16", "-g", "8",
                     "-r", "1", "--peer")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("localchat: error: llama-bench failed (exit 1): "), last
    assert "failed to load model" in last
