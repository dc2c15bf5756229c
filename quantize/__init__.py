"""localchat's quantization library: `localchat quantize` converts between GGUF and Hugging Face
formats (NF4, INT8/INT4, GPTQ, llama.cpp's types), `localchat eval` measures what was lost,
and `localchat distill` trains drafts."""
