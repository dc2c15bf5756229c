"""localchat's quantization library (not yet written).

It will convert checkpoints (GGUF, Hugging Face safetensors) to quantized forms --
absmax per tensor/row/group, NF4, INT8/INT4, GPTQ -- and measure honestly what each
loses: per-matrix error, perplexity, agreement with the full-precision model and
acceptance as a speculative draft. `localchat quantize` and `localchat eval` will be
its commands.
"""
