"""The user's saved conversations as chat messages, for `localchat distill --history`."""

from __future__ import annotations

from localchat.engine.base import Message
from localchat.storage.conversations import ConversationStore


def conversation_messages(limit: int = 500) -> list[list[Message]]:
    """Each stored conversation's current branch (system prompt first), newest first;
    empty and unfinished replies are left out."""
    store = ConversationStore.open()
    try:
        out = []
        for conversation in store.list_conversations()[:limit]:
            messages = [Message("system", conversation.system_prompt)] if conversation.system_prompt else []
            messages += [Message(m.role, m.content) for m in store.messages(conversation.id)
                         if m.role in ("user", "assistant") and m.content]
            if any(m.role == "assistant" for m in messages):
                out.append(messages)
        return out
    finally:
        store.close()
