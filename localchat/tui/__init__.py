"""The Textual chat UI. It talks only to the engine interface (localchat.engine.base)."""
