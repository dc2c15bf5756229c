"""Chat prompt construction shared by every engine.

template.py renders a model's (untrusted) chat template in a bounded sandbox and keeps
typed message text apart from the template's control tokens; context.py decides which
history fits in the context window.
"""
