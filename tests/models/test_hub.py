"""Hub references: parsing, safety checks, and resolution against a local cache.

No test here may reach the network: every socket connect raises.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import RepositoryNotFoundError

from localchat.errors import HubError, ModelFormatError, ModelNotFoundError, UsageError
from localchat.models import hub
from localchat.models.hub import HubRef, cached_gguf_files, cached_spec, fetch, parse_hub_ref
from helpers.tiny_files import write_tiny_gguf

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(cache: Path, repo_id: str, filename: str, content: bytes) -> Path:
    """Lay a file out the way huggingface_hub does: blob + snapshot symlink + refs/main."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    blob = repo_dir / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    link = repo_dir / "snapshots" / COMMIT / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    return link


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a test tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache, offline (env and huggingface_hub's import-time constants)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def tiny(tmp_path: Path) -> bytes:
    return write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()


# --- parsing ---------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("o/r:file.gguf", HubRef("o/r", filename="file.gguf")),
        ("o/r:sub/dir/file.GGUF", HubRef("o/r", filename="sub/dir/file.GGUF")),
        ("o/r:Q4_K_M", HubRef("o/r", quant="Q4_K_M")),
        ("hf.co/o/r:q4_k_m", HubRef("o/r", quant="Q4_K_M")),
        ("huggingface.co/Org-1/My.Model_v2:IQ4_XS", HubRef("Org-1/My.Model_v2", quant="IQ4_XS")),
        ("https://hf.co/o/r:f16", HubRef("o/r", quant="F16")),
    ],
)
def test_parse_forms(spec: str, expected: HubRef) -> None:
    assert parse_hub_ref(spec) == expected


def test_spec_round_trip() -> None:
    assert HubRef("o/r", quant="Q4_K_M").spec == "o/r:Q4_K_M"
    assert HubRef("o/r", filename="a.gguf").spec == "o/r:a.gguf"


@pytest.mark.parametrize(
    "spec",
    [
        "o/r:../x.gguf",
        "o/r:a/../../x.gguf",
        "o/r:/etc/passwd.gguf",
        "o/r:/etc/passwd",
        "../r:x.gguf",
        "o/..:x.gguf",
        "o/r..x:x.gguf",
        "-o/r:x.gguf",
        "o/r:a\\b.gguf",
        "o/r:a\0b.gguf",
        "o/r:a//b.gguf",
        "o/r:",
        "o/r:model.safetensors",
        "o/r:pytorch_model.bin",
        "o r/x:Q4_0",
    ],
)
def test_rejected_refs(spec: str) -> None:
    with pytest.raises(UsageError):
        parse_hub_ref(spec)


@pytest.mark.parametrize(
    "spec", ["model.gguf", "./models/x.gguf", "/abs/path/x.gguf", "a/b/c:x.gguf", "C:\\m\\x.gguf", "o/r", "default"]
)
def test_not_hub_shaped(spec: str) -> None:
    assert parse_hub_ref(spec) is None


def test_existing_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "r:x.gguf").write_bytes(b"")
    assert parse_hub_ref("o/r:x.gguf") is None


# --- quant selection ---------------------------------------------------------


def test_pick_quant_prefers_single_file() -> None:
    names = ["README.md", "m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf"]
    assert hub._pick_quant(HubRef("o/r", quant="Q4_K_M"), names) == ["m-Q4_K_M.gguf"]


def test_pick_quant_split_set() -> None:
    names = ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf", "m-Q4_0.gguf"]
    assert hub._pick_quant(HubRef("o/r", quant="Q8_0"), names) == names[:2]


def test_pick_quant_is_a_token_match() -> None:
    names = ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf"]
    assert hub._pick_quant(HubRef("o/r", quant="Q4_K"), names) == []
    assert hub._pick_quant(HubRef("o/r", quant="Q4_K_S"), names) == ["m-Q4_K_S.gguf"]


def test_pick_quant_ambiguous() -> None:
    with pytest.raises(HubError, match="ambiguous.*a-Q4_0.gguf.*b-Q4_0.gguf"):
        hub._pick_quant(HubRef("o/r", quant="Q4_0"), ["a-Q4_0.gguf", "b-Q4_0.gguf"])


# --- offline resolution against the cache ----------------------------------


def test_cached_file_resolves_offline(cache: Path, tiny: bytes) -> None:
    link = add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)
    path = fetch(parse_hub_ref("owner/repo:tiny-Q4_1.gguf"))
    assert path == link
    assert path.read_bytes() == tiny


def test_cached_quant_resolves_offline(cache: Path, tiny: bytes, tmp_path: Path) -> None:
    other = write_tiny_gguf(tmp_path / "other.gguf", name="other").read_bytes()
    want = add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)
    add_to_cache(cache, "owner/repo", "tiny-Q8_0.gguf", other)
    assert fetch(parse_hub_ref("owner/repo:q4_1")) == want


def test_uncached_offline_is_not_found(cache: Path, tiny: bytes) -> None:
    add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)
    for spec in ["owner/repo:other.gguf", "owner/repo:Q8_0", "nobody/nothing:Q4_K_M", "nobody/nothing:x.gguf"]:
        with pytest.raises(ModelNotFoundError, match=r"not downloaded: .*offline; run `localchat pull "):
            fetch(parse_hub_ref(spec))


def test_local_only_never_touches_network(cache: Path, tiny: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    link = add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)
    assert fetch(parse_hub_ref("owner/repo:Q4_1"), local_only=True) == link
    with pytest.raises(ModelNotFoundError, match="not downloaded"):
        fetch(parse_hub_ref("owner/repo:Q5_0"), local_only=True)


def test_cached_file_is_validated(cache: Path) -> None:
    add_to_cache(cache, "owner/repo", "broken.gguf", b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(ModelFormatError, match="truncated or corrupt"):
        fetch(parse_hub_ref("owner/repo:broken.gguf"))


def test_cached_gguf_files_lists_first_shards(cache: Path, tiny: bytes) -> None:
    a = add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)
    b = add_to_cache(cache, "owner/repo", "big/m-00001-of-00002.gguf", tiny + b"1")
    add_to_cache(cache, "owner/repo", "big/m-00002-of-00002.gguf", tiny + b"2")
    add_to_cache(cache, "owner/repo", "README.md", b"hi")
    files = cached_gguf_files()
    assert sorted(files) == sorted([("owner/repo", a), ("owner/repo", b)])
    assert cached_spec("owner/repo", b) == "owner/repo:big/m-00001-of-00002.gguf"


def test_no_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "missing"))
    assert cached_gguf_files() == []


# --- online paths, with huggingface_hub's functions replaced -----------------


@pytest.fixture
def online(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def listing(*names: str) -> SimpleNamespace:
    """What model_info returns, as far as fetch looks at it."""
    return SimpleNamespace(siblings=[SimpleNamespace(rfilename=n) for n in names])


def test_online_quant_downloads_chosen_file(online: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = write_tiny_gguf(tmp_path / "dl.gguf")
    calls: list[tuple[str, str]] = []

    def fake_download(repo_id: str, filename: str, cache: Path, **kw: object) -> Path:
        calls.append((repo_id, filename))
        return tiny

    monkeypatch.setattr(huggingface_hub, "model_info", lambda repo_id, **kw: listing("a-Q4_0.gguf", "a-Q6_K.gguf"))
    monkeypatch.setattr(hub.hub_download, "download", fake_download)
    assert fetch(parse_hub_ref("o/r:Q6_K")) == tiny
    assert calls == [("o/r", "a-Q6_K.gguf")]
    with pytest.raises(HubError, match="no Q8_0 file in o/r; it has: a-Q4_0.gguf, a-Q6_K.gguf"):
        fetch(parse_hub_ref("o/r:Q8_0"))


def test_online_repo_not_found(online: None, monkeypatch: pytest.MonkeyPatch) -> None:
    response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/api/models/o/r"))

    def missing(*args: object, **kwargs: object) -> None:
        raise RepositoryNotFoundError("404 Client Error", response=response)

    monkeypatch.setattr(huggingface_hub, "model_info", missing)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", missing)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    with pytest.raises(HubError, match="repository not found on the hub: o/r"):
        fetch(parse_hub_ref("o/r:Q4_0"))
    with pytest.raises(HubError, match="repository not found on the hub: o/r"):
        fetch(parse_hub_ref("o/r:x.gguf"))


def test_online_connection_error(online: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*args: object, **kwargs: object) -> None:
        raise httpx2.ConnectError("name resolution failed")

    monkeypatch.setattr(huggingface_hub, "model_info", down)
    with pytest.raises(HubError, match="cannot reach the hub"):
        fetch(parse_hub_ref("o/r:Q4_0"))


# --- an unreachable hub: one quick request, then the cache or one line -------


def test_first_requests_have_a_short_timeout_and_no_retries(
    online: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = write_tiny_gguf(tmp_path / "dl.gguf")
    seen: list[tuple[str, object]] = []

    def info(repo_id: str, **kw: object) -> SimpleNamespace:
        seen.append(("model_info", kw.get("timeout")))
        return listing("a-Q4_0.gguf")

    def head(url: str, **kw: object) -> None:
        seen.append(("head", kw.get("timeout")))
        assert not kw.get("retry_on_errors")

    monkeypatch.setattr(huggingface_hub, "model_info", info)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", head)
    monkeypatch.setattr(hub.hub_download, "download", lambda *a, **kw: tiny)
    assert fetch(parse_hub_ref("o/r:Q4_0")) == tiny
    assert fetch(parse_hub_ref("o/r:a-Q4_0.gguf")) == tiny
    assert seen == [("model_info", hub.PROBE_TIMEOUT), ("head", hub.PROBE_TIMEOUT)]


def test_unreachable_hub_serves_the_cache(
    online: None, cache: Path, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)

    def down(*args: object, **kwargs: object) -> None:
        raise httpx2.ConnectTimeout("timed out")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", down)
    assert fetch(parse_hub_ref("owner/repo:tiny-Q4_1.gguf")) == link
    with pytest.raises(HubError) as info:
        fetch(parse_hub_ref("owner/repo:other.gguf"))
    assert str(info.value) == (
        "cannot download owner/repo:other.gguf: the hub is unreachable (timed out) and it is not in the local cache"
    )


def test_hub_http_errors_fall_back_to_the_cache(
    online: None, cache: Path, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub that answers an HTTP error (503) serves the cached copy, as hf_hub_download
    would; with nothing cached, one line names the error. 404s are final (next test)."""
    response = httpx2.Response(503, request=httpx2.Request("HEAD", "https://huggingface.co/o/r/resolve/main/x.gguf"))

    def busy(*args: object, **kwargs: object) -> None:
        raise huggingface_hub.errors.HfHubHTTPError("503 Server Error", response=response)

    link = add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", busy)
    assert fetch(parse_hub_ref("owner/repo:tiny-Q4_1.gguf")) == link
    with pytest.raises(HubError, match="hub request for owner/repo:other.gguf failed: 503 Server Error"):
        fetch(parse_hub_ref("owner/repo:other.gguf"))


def test_missing_on_the_hub_does_not_use_the_cache(
    online: None, cache: Path, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = httpx2.Response(404, request=httpx2.Request("HEAD", "https://huggingface.co/owner/repo/resolve/main/x.gguf"))

    def missing(*args: object, **kwargs: object) -> None:
        raise RepositoryNotFoundError("404 Client Error", response=response)

    add_to_cache(cache, "owner/repo", "tiny-Q4_1.gguf", tiny)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", missing)
    with pytest.raises(HubError, match="repository not found on the hub: owner/repo"):
        fetch(parse_hub_ref("owner/repo:tiny-Q4_1.gguf"))


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A local port that accepts connections and never answers: a hub that hangs."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def closed_port() -> int:
    """A local port nothing listens on: connections are refused."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.mark.subprocess
@pytest.mark.parametrize("hang", [True, False], ids=["silent", "refused"])
@pytest.mark.parametrize("spec", ["someowner/somerepo:model.gguf", "someowner/somerepo:Q4_K_M"])
def test_pull_with_hub_unreachable_fails_fast_in_one_line(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hang: bool, spec: str
) -> None:
    """The real CLI, online, against a hub that hangs or refuses: no retries for
    a minute (or hours), no retry warnings, no traceback: one line and exit 1."""
    port = request.getfixturevalue("silent_server") if hang else closed_port()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for var in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_DISABLE_TELEMETRY", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    if hang and spec.endswith(":Q4_K_M"):  # a user's own probe timeout (model.gguf keeps the 5 s default)
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "localchat", "pull", spec], capture_output=True, text=True, timeout=60, env=os.environ
    )
    print(f"pull {spec} ({'silent' if hang else 'refused'}): {time.monotonic() - start:.1f} s")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("localchat: error: ") and spec in lines[0]
    assert "unreachable" in lines[0] or "cannot reach the hub" in lines[0]
    assert done.stdout == ""
