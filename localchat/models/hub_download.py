"""Download one hub file into huggingface_hub's cache layout (blobs/DIGEST, snapshots/COMMIT/FILE,
refs/REVISION), trusting nothing the hub answers: the digest and commit must be plain hex before
any path is built from them, the bytes are hashed as they arrive and must match the digest, the
body may not outgrow its advertised size, and retries are bounded (MAX_ATTEMPTS GETs, each read
within HF_HUB_DOWNLOAD_TIMEOUT; a partial file is resumed by the next pull, or removed when this
one gives up)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from localchat.errors import HubError

DIGEST = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git blob sha1, or the LFS sha256
COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_ATTEMPTS = 5  # GETs per file, each resuming where the last one stopped
CHUNK = 1 << 20


def download(repo_id: str, filename: str, cache: Path, *, timeout: float,
             revision: str = "main") -> Path:
    """The snapshot path of repo_id:filename at revision, downloaded into cache unless its
    blob is there already. huggingface_hub's errors (missing, gated, HTTP) pass through;
    an unsafe or lying answer raises HubError."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    spec = f"{repo_id}:{filename}"
    url = hf_hub_url(repo_id, filename, revision=revision)
    meta = get_hf_file_metadata(url, timeout=timeout)
    digest = checked_hex(meta.etag, DIGEST, "digest (ETag)", spec)
    commit = checked_hex(meta.commit_hash, COMMIT, "commit (X-Repo-Commit)", spec)
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    blob = repo_dir / "blobs" / digest
    link = repo_dir / "snapshots" / commit / filename
    for path in (blob, link):  # the parts were checked; this guards against what was missed
        if not path.resolve().is_relative_to(cache.resolve()):
            raise HubError(f"refusing {spec}: the hub's answer names a path outside the cache")
    if not blob.is_file():
        size = meta.size if isinstance(meta.size, int) and meta.size >= 0 else None
        # Xet-stored files are fetched through the hub's URL, which redirects (dropping the
        # token off the hub's host); others from the location the HEAD answered, with the
        # token only if that is the hub's host (as huggingface_hub does).
        location = url if meta.xet_file_data is not None else meta.location
        _fetch_blob(spec, location, blob, digest, size, same_host(url, location))
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / revision).write_text(commit)
    return link


def same_host(a: str, b: str) -> bool:
    return urlsplit(a).netloc == urlsplit(b).netloc


def checked_hex(value: Any, pattern: re.Pattern[str], what: str, spec: str) -> str:
    """value when it is hex of the pattern's length (lower-cased), else HubError."""
    text = value.lower() if isinstance(value, str) else ""
    if not pattern.fullmatch(text):
        shown = repr(value)[:80]
        raise HubError(f"refusing {spec}: the hub sent an invalid {what} {shown}")
    return text


class _Partial:
    """The bytes received so far (`have`, in `out`) and their running hash: sha256, or git's
    blob sha1 for a 40-hex digest."""

    def __init__(self, out: BinaryIO, digest: str, size: int | None, spec: str) -> None:
        if len(digest) != 64 and size is None:
            raise HubError(f"refusing {spec}: the hub gave a git digest but no size to check it")
        self.out, self.digest, self.size, self.spec = out, digest, size, spec
        self.have, self.hash = 0, self._new_hash()
        out.seek(0)  # what a killed pull left: hashed again, nothing of it trusted
        while block := out.read(CHUNK):
            self.hash.update(block)
            self.have += len(block)
        if size is not None and self.have > size:
            self.restart()

    def _new_hash(self) -> Any:
        if len(self.digest) == 64:
            return hashlib.sha256()
        return hashlib.sha1(b"blob %d\0" % self.size)

    def restart(self) -> None:
        self.out.truncate(0)
        self.have, self.hash = 0, self._new_hash()

    def add(self, data: bytes) -> None:
        if self.size is not None and self.have + len(data) > self.size:
            raise HubError(f"download of {self.spec} failed: the hub sent more than the "
                           f"{self.size} bytes it announced; the file was removed")
        self.out.write(data)
        self.hash.update(data)
        self.have += len(data)

    @property
    def complete(self) -> bool:
        return self.have == self.size


def _fetch_blob(spec: str, url: str, blob: Path, digest: str, size: int | None,
                with_token: bool) -> None:
    """GET url into blob.incomplete (resuming one a killed pull left), then rename it to blob
    once its hash matches the digest; HubError after MAX_ATTEMPTS or on a mismatch."""
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + ".incomplete")
    with open(partial, "ab+") as out:
        try:
            fcntl.flock(out, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise HubError(f"another pull is downloading {spec} right now") from None
        try:
            _fill(url, _Partial(out, digest, size, spec), with_token)
        except BaseException as e:
            if not isinstance(e, KeyboardInterrupt):  # Ctrl-C: the next pull resumes it
                partial.unlink(missing_ok=True)
            raise
        os.replace(partial, blob)


def _fill(url: str, state: _Partial, with_token: bool) -> None:
    """Append the rest of the body until it is complete; its hash must match the digest."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, tqdm

    headers, why = build_hf_headers(), "no answer"
    if not with_token:  # a signed CDN URL: the token stays with the hub
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    read_timeout = float(constants.HF_HUB_DOWNLOAD_TIMEOUT)  # to connect, and between reads
    bar = tqdm(total=state.size, initial=state.have, unit="B", unit_scale=True,
               desc=state.spec.rsplit("/", 1)[-1], disable=not sys.stderr.isatty())
    with bar, httpx2.Client(follow_redirects=True, timeout=httpx2.Timeout(read_timeout)) as client:
        for attempt in range(MAX_ATTEMPTS + 1):
            if state.complete:
                break
            if attempt == MAX_ATTEMPTS:
                raise HubError(f"download of {state.spec} failed: gave up after {MAX_ATTEMPTS} "
                               f"attempts ({why}); the partial file was removed")
            try:
                _get(client, url, headers, state, bar)
            except httpx2.TransportError as e:
                why = _first_line(e)
                continue
            if state.size is None:  # no size announced: the body ends when the server ends it
                break
            why = f"the body stopped at {state.have} of {state.size} bytes"
    if state.hash.hexdigest() != state.digest:
        raise HubError(f"download of {state.spec} is corrupt: its bytes do not match the hub's "
                       f"digest {state.digest[:12]}...; the file was removed")


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:120] if lines else type(e).__name__


def _get(client: Any, url: str, headers: dict[str, str], state: _Partial, bar: Any) -> None:
    """One GET from byte state.have on, its bytes added to state as they arrive."""
    from huggingface_hub.utils import hf_raise_for_status

    ask = dict(headers, **({"Range": f"bytes={state.have}-"} if state.have else {}))
    with client.stream("GET", url, headers=ask) as response:
        hf_raise_for_status(response)
        if state.have and response.status_code != 206:  # the range was ignored: start over
            state.restart()
            bar.reset(total=state.size)
        for data in response.iter_bytes():  # as received: a cut keeps what came
            state.add(data)
            bar.update(len(data))
