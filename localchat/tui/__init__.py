"""The Textual chat UI (app.py: ChatApp) over a ChatSession; of the engines it knows only
their interface (localchat.engine.base)."""
