"""The engine as a whole: routing, speculative, distributed, load and memory, its faces, the GPU."""
