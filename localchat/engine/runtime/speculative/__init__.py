"""Speculative decoding: the exact acceptance rule (rule.py), γ's adaptation (adaptive.py),
a request's state (state.py) and where drafts come from (drafts.py)."""
