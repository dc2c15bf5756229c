"""localchat's runtime, written once for every executor: the Sequence, the block manager
(16-token blocks, prefix cache), the scheduler (continuous batching), sampling,
speculative decoding and the step loop (runner.py) behind the engine interface (engine.py)."""
