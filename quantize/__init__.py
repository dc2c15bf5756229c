"""localchat's quantization library: `localchat quantize` converts, `localchat eval`
measures what was lost.

Converting: gguf_quantize.py (GGUF -> GGUF: gguf-py's quantizers, byte-identical to
llama.cpp's, and llama.cpp's K-quant mixes), nf4_hf.py / int_hf.py (safetensors NF4,
INT8, INT4 over hf_rewrite.py), export_hf.py (GGUF -> HF dir), hf_to_gguf.py (HF dir -> GGUF), gguf_convert.py (float32
GGUF), safe_output.py (never destroy data), gptq.py (GPTQ for one matrix). Measuring: schemes.py (round-to-nearest
schemes), matrix_stats.py, quality.py (perplexity, KL, agreement, α), simulate.py,
eval_table.py (`eval --table`), eval_file.py (`eval -m`, `quantize --report`).
"""
