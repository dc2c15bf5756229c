"""One chat message, the unit every layer passes around (prompt rendering, the engine, the
history). A bottom module: it imports nothing from localchat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
