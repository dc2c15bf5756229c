"""The torch executor: executor.py (forward over a batch), model.py (Llama-family forward
over the paged KV store), qlinear.py and the weight formats (GGUF, NF4, INT8/INT4, GPTQ,
Hugging Face directories)."""
