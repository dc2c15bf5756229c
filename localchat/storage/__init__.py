"""Conversation history: SQLite in the data dir (db.py), the store API
(conversations.py), a reply's status (reply_status.py), streaming replies into it
(reply_writer.py), exports (export.py)."""

from localchat.storage.conversations import (
    Conversation,
    ConversationStore,
    StoredMessage,
    StoreError,
    title_from,
)
from localchat.storage.db import StoreUnavailable, default_db_path, set_aside
from localchat.storage.reply_status import ReplyStatus
from localchat.storage.reply_writer import ReplyWriter

__all__ = ["Conversation", "ConversationStore", "ReplyStatus", "ReplyWriter", "StoreError",
           "StoreUnavailable", "StoredMessage", "default_db_path", "set_aside", "title_from"]
