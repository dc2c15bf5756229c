"""`pull` against a hostile or broken hub (a real HTTP server on 127.0.0.1): nothing is written
outside the cache, bytes must match the advertised digest, and a cut or stalled body ends in
bounded attempts with no partial file left behind."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from localchat.errors import HubError
from localchat.models.hub import fetch, parse_hub_ref
from localchat.models import hub_download
from helpers.fake_hub import COMMIT, FakeHub, HubFile
from helpers.tiny_files import write_tiny_gguf

REPO = "owner/repo"


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The fake hub as huggingface_hub's endpoint, online, with an empty cache in tmp_path/hf/hub."""
    served = FakeHub()
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", served.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        served.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 1)
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    yield served
    served.close()


@pytest.fixture
def body(tmp_path: Path) -> bytes:
    return write_tiny_gguf(tmp_path / "tiny-src.gguf").read_bytes()


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_honest_hub_downloads_once(fake_hub: FakeHub, body: bytes, tmp_path: Path) -> None:
    f = fake_hub.add(REPO, "tiny.gguf", HubFile(body))
    path = fetch(parse_hub_ref(f"{REPO}:tiny.gguf"))
    assert path.read_bytes() == body
    assert path == tmp_path / "hf/hub/models--owner--repo/snapshots" / COMMIT / "tiny.gguf"
    assert fetch(parse_hub_ref(f"{REPO}:tiny.gguf")) == path
    assert f.gets == [""]  # the second fetch found the blob


def test_etag_path_traversal_is_refused(fake_hub: FakeHub, body: bytes, tmp_path: Path) -> None:
    """Issue 39 #1: an etag of ../../ must not become a path (Probllama, CVE-2024-37032)."""
    fake_hub.add(REPO, "tiny.gguf", HubFile(body, etag="../../../../outside/x"))
    before = files_under(tmp_path)
    with pytest.raises(HubError, match=r"invalid digest \(ETag\)"):
        fetch(parse_hub_ref(f"{REPO}:tiny.gguf"))
    assert files_under(tmp_path) == before
    assert not (tmp_path / "outside").exists()


def test_bytes_not_matching_the_digest_are_refused(fake_hub: FakeHub, body: bytes, tmp_path: Path) -> None:
    """Issue 39 #2: hashed while downloading; a mismatch leaves nothing behind."""
    other = bytearray(body)
    other[-1] ^= 1  # still a valid GGUF: the last byte is tensor data
    fake_hub.add(REPO, "tiny.gguf", HubFile(body, served=bytes(other)))
    with pytest.raises(HubError, match="do not match the hub's digest"):
        fetch(parse_hub_ref(f"{REPO}:tiny.gguf"))
    blobs = tmp_path / "hf/hub/models--owner--repo/blobs"
    assert not blobs.exists() or list(blobs.iterdir()) == []


def test_git_sha1_digest_is_checked(fake_hub: FakeHub, body: bytes) -> None:
    git_sha1 = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    fake_hub.add(REPO, "good.gguf", HubFile(body, etag=git_sha1))
    assert fetch(parse_hub_ref(f"{REPO}:good.gguf")).read_bytes() == body
    fake_hub.add(REPO, "bad.gguf", HubFile(body, etag=hashlib.sha1(body).hexdigest()))
    with pytest.raises(HubError, match="do not match"):
        fetch(parse_hub_ref(f"{REPO}:bad.gguf"))


@pytest.mark.subprocess
def test_commit_path_traversal_is_one_line(fake_hub: FakeHub, body: bytes, tmp_path: Path) -> None:
    """Issue 39 #3: X-Repo-Commit: ../../x was a 45-line traceback; now one line, exit 1."""
    fake_hub.add(REPO, "tiny.gguf", HubFile(body, commit="../../../outside"))
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-m", "localchat", "pull", f"{REPO}:tiny.gguf"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"localchat: error: refusing {REPO}:tiny.gguf: the hub sent an invalid commit "
        "(X-Repo-Commit) '../../../outside'"]
    assert not (tmp_path / "outside").exists()
    assert not (tmp_path / "hf/hub/models--owner--repo/snapshots").exists()


@pytest.mark.parametrize("stall", [False, True], ids=["cut", "stalled"])
def test_cut_body_gives_up_after_bounded_attempts(fake_hub: FakeHub, body: bytes, tmp_path: Path,
                                                  stall: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39 #4: a body cut (or stalled) mid-download: MAX_ATTEMPTS resumed GETs, then one
    line, and no .incomplete file left to grow."""
    if stall:  # each attempt waits out the read timeout: half a second, not the fixture's 1 s
        monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)
    f = fake_hub.add(REPO, "tiny.gguf", HubFile(body, cut=50, stall=stall))
    with pytest.raises(HubError, match=rf"gave up after {hub_download.MAX_ATTEMPTS} attempts"):
        fetch(parse_hub_ref(f"{REPO}:tiny.gguf"))
    assert len(f.gets) == hub_download.MAX_ATTEMPTS
    assert f.gets[:2] == ["", "bytes=50-"]  # each attempt resumes
    blobs = tmp_path / "hf/hub/models--owner--repo/blobs"
    assert list(blobs.iterdir()) == []


def test_partial_file_from_a_killed_pull_is_resumed(fake_hub: FakeHub, body: bytes, tmp_path: Path) -> None:
    """What a kill -9'd pull leaves is picked up by the next pull, not left to grow."""
    f = fake_hub.add(REPO, "tiny.gguf", HubFile(body))
    blobs = tmp_path / "hf/hub/models--owner--repo/blobs"
    blobs.mkdir(parents=True)
    digest = hashlib.sha256(body).hexdigest()
    (blobs / f"{digest}.incomplete").write_bytes(body[:100])
    assert fetch(parse_hub_ref(f"{REPO}:tiny.gguf")).read_bytes() == body
    assert f.gets == ["bytes=100-"]
    assert sorted(p.name for p in blobs.iterdir()) == [digest]


def test_body_longer_than_announced_is_cut_off(fake_hub: FakeHub, body: bytes, tmp_path: Path) -> None:
    fake_hub.add(REPO, "tiny.gguf", HubFile(body, served=body + b"x" * 4096))
    with pytest.raises(HubError, match="more than the .* bytes it announced"):
        fetch(parse_hub_ref(f"{REPO}:tiny.gguf"))
    assert list((tmp_path / "hf/hub/models--owner--repo/blobs").iterdir()) == []
