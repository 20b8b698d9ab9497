"""Models: a spec resolved to GGUF, weights and tokenizer; every GGUF byte read or written; the
check that a model folder runs no code."""
