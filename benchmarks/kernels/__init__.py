"""The kernels on their own: GGUF blocks, attention, linears, step breakdowns, threads."""
