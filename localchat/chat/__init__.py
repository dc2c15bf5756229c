"""The conversation without a UI: prompt construction (template.py, sandbox.py, context.py),
slash commands, attachments, reasoning blocks, and the ChatSession (session.py) that the
TUI drives."""
