"""Executors run forward passes over a batch of sequences for the runtime (base.py):
llama.cpp's kernels (llamacpp.py) or our torch model (torch/)."""
