"""mcp.json, in the shape Claude Desktop, Cursor and LM Studio read:
{"mcpServers": {"NAME": {"command": ..., "args": [...], "env": {...}} | {"url": ...}}}.
From --mcp FILE, else the data dir's mcp.json; a file that is not that shape is one line
naming what is wrong. The file is read as untrusted input (size, types)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from localchat.errors import UsageError
from localchat.paths import data_dir

MAX_BYTES = 1 << 20
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
INHERITED_ENV = ("PATH", "HOME")  # all a stdio server gets beside the file's own env


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server: a command started over stdio, or a streamable HTTP URL."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str | None = None
    allow: tuple[str, ...] = field(default=())  # tools trusted without asking (localchat's key)

    def environment(self) -> dict[str, str]:
        """PATH and HOME from ours, then the file's env for this server; nothing else."""
        base = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        return {**base, **dict(self.env)}


def default_path() -> Path:
    return data_dir() / "mcp.json"


def load_servers(path: str | Path | None = None) -> list[ServerSpec]:
    """The servers a config file names ([] when no --mcp is given and the data dir has no
    mcp.json); UsageError, one line naming the file and the entry, for anything else."""
    explicit = path is not None
    path = Path(path).expanduser() if explicit else default_path()
    try:
        if not path.is_file():
            if explicit:
                raise UsageError(f"--mcp {path}: no such file")
            return []
        if path.stat().st_size > MAX_BYTES:
            raise UsageError(f"{path}: larger than {MAX_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid JSON ({e})") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise UsageError(f'{path}: expected {{"mcpServers": {{"NAME": {{...}}}}}}')
    return [_server(path, name, entry) for name, entry in servers.items()]


def _server(path: Path, name: str, entry) -> ServerSpec:
    where = f"{path}: mcpServers.{name}"
    if not isinstance(name, str) or not NAME.match(name):
        raise UsageError(f"{where}: a server name is letters, digits, '_', '.' or '-'")
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: must be an object with a command or a url")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise UsageError(f"{where}: give a command (stdio) or a url (HTTP), not both")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise UsageError(f"{where}.url: must be an http:// or https:// URL")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise UsageError(f"{where}.command: must be a non-empty string")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UsageError(f"{where}.args: must be a list of strings")
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise UsageError(f"{where}.env: must be an object of strings")
    allow = entry.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise UsageError(f"{where}.allow: must be a list of tool names")
    return ServerSpec(name, command, tuple(args), tuple(sorted(env.items())), url, tuple(allow))
