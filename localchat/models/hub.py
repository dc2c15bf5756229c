"""Hugging Face references, `OWNER/REPO:FILE.gguf` or `OWNER/REPO:QUANT`, checked before any disk
or network access (never a path outside the hub cache); fetched through huggingface_hub (offline
or local_only: from its cache only). Every file returned has passed validate_model_file."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import HubError, LocalchatError, ModelNotFoundError, UsageError
from localchat.models import hub_download
from localchat.models.files import validate_model_file

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_QUANT = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_PREFIXES = ("https://", "http://")
_HOSTS = ("hf.co/", "huggingface.co/")
PROBE_TIMEOUT = 5.0  # seconds to connect, and between bytes, for the first request to the hub


@dataclass(frozen=True)
class HubRef:
    """A validated reference: exactly one of filename / quant is set."""

    repo_id: str
    filename: str | None = None
    quant: str | None = None

    @property
    def spec(self) -> str:
        return f"{self.repo_id}:{self.filename or self.quant}"


def parse_hub_ref(spec: str) -> HubRef | None:
    """The HubRef a SPEC names, or None when it is not hub-shaped (a local path).

    Hub-shaped means `[hf.co/]OWNER/REPO:REST` with exactly one `/` before the colon.
    A hub-shaped SPEC that is unsafe or malformed raises UsageError.
    """
    spec = spec.strip()
    if not spec or _exists(spec):
        return None
    rest = spec
    for prefix in _PREFIXES:
        rest = rest.removeprefix(prefix)
    for host in _HOSTS:
        if rest.startswith(host):
            rest = rest[len(host) :]
            break
    repo_id, colon, target = rest.partition(":")
    if not colon or repo_id.count("/") != 1:
        return None
    owner, repo = repo_id.split("/")
    for part in (owner, repo):
        if not _NAME.fullmatch(part) or ".." in part:
            raise UsageError(f"invalid hub repository {repo_id!r} in {spec!r} (expected OWNER/REPO)")
    if target.lower().endswith(".gguf"):
        _check_filename(target, spec)
        return HubRef(repo_id, filename=target)
    if _QUANT.fullmatch(target):
        return HubRef(repo_id, quant=target.upper())
    if target.lower().endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl", ".safetensors")):
        raise UsageError(f"{spec!r}: only .gguf files can be used from the hub")
    raise UsageError(
        f"invalid model spec {spec!r}: expected OWNER/REPO:FILE.gguf or OWNER/REPO:QUANT (e.g. Q4_K_M)"
    )


def _exists(spec: str) -> bool:
    try:
        return Path(spec).expanduser().exists()
    except (OSError, ValueError):  # e.g. an embedded NUL: not a usable path either
        return False


def _check_filename(name: str, spec: str) -> None:
    """A relative POSIX path inside the repo: nothing that could escape the cache."""
    bad = (
        "\\" in name
        or "\0" in name
        or ":" in name
        or name.startswith("/")
        or any(part in ("", ".", "..") for part in name.split("/"))
    )
    if bad:
        raise UsageError(f"unsafe file name in {spec!r}: must be a relative path inside the repository")


def is_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub saw it at import, or as the environment says now."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or env.strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def fetch(ref: HubRef, *, local_only: bool = False) -> Path:
    """Download (or find in the cache) the file a ref names; return its validated path.

    With local_only, or when offline, nothing goes over the network.
    """
    offline_env = is_offline()
    offline = local_only or offline_env
    if ref.filename:
        names = _with_shards(ref.filename)
    elif offline:
        names = _pick_quant(ref, _cached_names(ref.repo_id))
        if not names:  # the hub may have it; we only know what is cached
            raise _not_downloaded(ref, offline_env=offline_env)
    else:
        remote = _remote_names(ref)  # this request is the probe: the hub answered it
        names = _pick_quant(ref, remote)
        if not names:
            raise HubError(f"no {ref.quant} file in {ref.repo_id}; it has: {_listing(remote)}")
    if ref.filename and not offline and (down := _probe(ref.repo_id, names[0])) is not None:
        paths = _cached_or_unreachable(ref, names, down)
    else:
        paths = [_download(ref, name, offline, offline_env=offline_env) for name in names]
    for path in paths:
        validate_model_file(path)
    return paths[0]


def _with_shards(filename: str) -> list[str]:
    """A split model's first shard needs its siblings next to it; others stand alone."""
    m = _SPLIT.search(filename)
    if not m or int(m.group(1)) != 1:
        return [filename]
    total, stem = int(m.group(2)), filename[: m.start()]
    return [f"{stem}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]


def _listing(names: list[str]) -> str:
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    return ", ".join(ggufs) if ggufs else "no .gguf files"


def _pick_quant(ref: HubRef, names: list[str]) -> list[str]:
    """The single .gguf file whose name has QUANT as a token, or one complete split set.

    [] when nothing matches; HubError when several do.
    """
    assert ref.quant is not None
    token = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(ref.quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    matches = [n for n in ggufs if token.search(n.rsplit("/", 1)[-1])]
    single = [n for n in matches if not _SPLIT.search(n)]
    firsts = [n for n in matches if (m := _SPLIT.search(n)) and int(m.group(1)) == 1]
    if len(single) == 1:
        return single
    if not single and len(firsts) == 1:
        return _with_shards(firsts[0])
    if not matches:
        return []
    shown = ", ".join(single or firsts or matches)
    raise HubError(f"{ref.spec} is ambiguous; name the file instead, one of: {shown}")


def _probe_timeout() -> float:
    """PROBE_TIMEOUT, or HF_HUB_ETAG_TIMEOUT where the user has set one (for slow links)."""
    from huggingface_hub import constants

    if constants.HF_HUB_ETAG_TIMEOUT != constants.DEFAULT_ETAG_TIMEOUT:
        return float(constants.HF_HUB_ETAG_TIMEOUT)
    return PROBE_TIMEOUT


def _probe(repo_id: str, filename: str) -> Exception | None:
    """One HEAD of the file, without retries: the transport error when the hub cannot be
    reached (refused, timed out, no route or name), else None, whatever the hub answered:
    its HTTP errors (missing, gated, down) are left to hf_hub_download, which handles them."""
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename), timeout=_probe_timeout())
    except httpx2.TransportError as e:
        return e
    except Exception:  # the hub answered
        pass
    return None


def _cached_or_unreachable(ref: HubRef, names: list[str], down: Exception) -> list[Path]:
    """The hub cannot be reached: the cached files (as hf_hub_download would fall back
    to), or one line saying so."""
    try:
        return [_download(ref, name, True, offline_env=False) for name in names]
    except ModelNotFoundError:
        raise HubError(f"cannot download {ref.spec}: the hub is unreachable "
                       f"({_first_line(down)}) and it is not in the local cache") from down


def _remote_names(ref: HubRef) -> list[str]:
    """The repo's file names, in one request with a timeout and no retries: model_info
    rather than list_repo_files, which has no timeout and retries for ~25 s."""
    from huggingface_hub import model_info

    try:
        info = model_info(ref.repo_id, timeout=_probe_timeout())
        return [s.rfilename for s in info.siblings or []]
    except Exception as e:
        mapped = _hub_error(ref, e, offline_env=False)
        if mapped is e:
            raise
        raise mapped from e


def _download(ref: HubRef, filename: str, offline: bool, *, offline_env: bool) -> Path:
    """Offline: the cached file (huggingface_hub's lookup). Online: hub_download's checked
    download, or the cached file when the hub answered with an error that is not final."""
    from huggingface_hub import hf_hub_download

    try:
        if offline:
            return Path(hf_hub_download(ref.repo_id, filename, cache_dir=hub_cache_dir(),
                                        local_files_only=True))
        try:
            return hub_download.download(ref.repo_id, filename, hub_cache_dir(),
                                         timeout=_probe_timeout())
        except Exception as e:
            if not _may_use_cache(e):
                raise
            try:
                return _download(ref, filename, True, offline_env=False)
            except ModelNotFoundError:
                raise e from None
    except LocalchatError:
        raise
    except Exception as e:
        if offline and _is_local_miss(e):
            raise _not_downloaded(ref, offline_env=offline_env) from e
        mapped = _hub_error(HubRef(ref.repo_id, filename=filename), e, offline_env)
        if mapped is e:
            raise
        raise mapped from e


def _may_use_cache(e: Exception) -> bool:
    """As hf_hub_download: a cached copy stands in when the hub cannot be reached or answers
    an HTTP error, unless the error says the file is not there for us."""
    import httpx2
    from huggingface_hub import errors as hf

    final = (hf.RepositoryNotFoundError, hf.GatedRepoError, hf.RevisionNotFoundError,
             hf.EntryNotFoundError)
    return isinstance(e, (httpx2.TransportError, hf.HfHubHTTPError)) and not isinstance(e, final)


def _is_local_miss(e: Exception) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    return isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled))


def _not_downloaded(ref: HubRef, *, offline_env: bool) -> ModelNotFoundError:
    why = "offline; " if offline_env else ""
    return ModelNotFoundError(
        f"not downloaded: {ref.spec} ({why}run `localchat pull {ref.spec}` when online)"
    )


def _hub_error(ref: HubRef, e: Exception, offline_env: bool) -> Exception:
    """huggingface_hub's many exceptions as one line each; unknown ones pass through."""
    from huggingface_hub import errors as hf

    if isinstance(e, hf.GatedRepoError):
        return HubError(f"{ref.repo_id} is gated: accept its terms on huggingface.co and log in (`hf auth login`)")
    if isinstance(e, hf.RepositoryNotFoundError):
        return HubError(f"repository not found on the hub: {ref.repo_id} (or it is private: log in with `hf auth login`)")
    if isinstance(e, hf.RevisionNotFoundError):
        return HubError(f"revision not found in {ref.repo_id}")
    if isinstance(e, hf.LocalEntryNotFoundError):
        if offline_env:
            return _not_downloaded(ref, offline_env=True)
        return HubError(f"cannot download {ref.spec}: the hub is unreachable and it is not in the local cache")
    if isinstance(e, hf.EntryNotFoundError):
        return ModelNotFoundError(f"file not found in {ref.repo_id}: {ref.filename or ref.quant}")
    if isinstance(e, hf.OfflineModeIsEnabled):
        return _not_downloaded(ref, offline_env=True)
    if isinstance(e, hf.HfHubHTTPError):
        return HubError(f"hub request for {ref.spec} failed: {_first_line(e)}")
    if isinstance(e, (ConnectionError, TimeoutError, OSError)) or type(e).__module__.startswith("httpx"):
        return HubError(f"cannot reach the hub for {ref.spec}: {_first_line(e)}")
    return e


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else type(e).__name__


def _repo_cache_dir(repo_id: str) -> Path:
    return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def _snapshots(repo_dir: Path) -> list[Path]:
    """Snapshot folders, the one refs/main points at first."""
    snaps_dir = repo_dir / "snapshots"
    if not snaps_dir.is_dir():
        return []
    snaps = sorted((p for p in snaps_dir.iterdir() if p.is_dir()), key=lambda p: -p.stat().st_mtime)
    try:
        main = (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    snaps.sort(key=lambda p: p.name != main)
    return snaps


def _cached_files(repo_dir: Path) -> dict[str, Path]:
    """Repo-relative name -> cached path, newest snapshot winning."""
    found: dict[str, Path] = {}
    for snap in _snapshots(repo_dir):
        for path in snap.rglob("*.gguf"):
            if path.is_file():
                found.setdefault(path.relative_to(snap).as_posix(), path)
    return found


def _cached_names(repo_id: str) -> list[str]:
    return sorted(_cached_files(_repo_cache_dir(repo_id)))


def cached_gguf_files() -> list[tuple[str, Path]]:
    """(repo id, path) for every cached GGUF model (a split set by its first shard)."""
    cache = hub_cache_dir()
    if not cache.is_dir():
        return []
    out: list[tuple[str, Path]] = []
    for repo_dir in sorted(cache.glob("models--*")):
        repo_id = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        for name, path in sorted(_cached_files(repo_dir).items()):
            m = _SPLIT.search(name)
            if m is None or int(m.group(1)) == 1:
                out.append((repo_id, path))
    return out


def remove_cached(path: Path) -> int:
    """Delete a cached GGUF (every shard of a split set) from each snapshot that holds it,
    with the blobs no other snapshot links; returns the bytes freed."""
    parts = path.parts
    if "snapshots" not in parts:
        raise ValueError(f"{path} is not in the hub cache")
    i = len(parts) - 1 - parts[::-1].index("snapshots")
    repo_dir, name = Path(*parts[:i]), "/".join(parts[i + 2:])
    split = _SPLIT.search(name)
    names = ({n for n in _cached_files(repo_dir) if _SPLIT.sub("", n) == _SPLIT.sub("", name)}
             if split else {name})
    links = [snap / n for snap in _snapshots(repo_dir) for n in names
             if (snap / n).is_symlink() or (snap / n).is_file()]
    sizes = {link.resolve(): link.stat().st_size for link in links if link.exists()}
    for link in links:
        link.unlink()
    still_linked = {p.resolve() for snap in _snapshots(repo_dir) for p in snap.rglob("*")
                    if p.is_symlink()}
    for blob in set(sizes) - still_linked:
        blob.unlink(missing_ok=True)  # a snapshot's plain file is gone already
    return sum(size for blob, size in sizes.items() if blob not in still_linked)


def cached_spec(repo_id: str, path: Path) -> str:
    """The SPEC that names a cached file: `OWNER/REPO:FILE` with FILE relative to its snapshot."""
    parts = path.parts
    if "snapshots" in parts:
        i = len(parts) - 1 - parts[::-1].index("snapshots")
        return f"{repo_id}:{'/'.join(parts[i + 2 :])}"
    return f"{repo_id}:{path.name}"
