"""A real inference engine in the loop: llama.cpp's `llama-server`, built from the pinned
llama-cpp-python sdist, serving a tiny random-weight model on loopback (docs/engine.md).

Its tokens are noise; its prefill cost, prompt cache, slots and continuous batching are the
engine's own, so the failure modes the project diagnoses can be produced by mechanism on it.
One concept per module: `build` (the sdist, cmake, the cache), `model` (the GGUF writer),
`prompts` (texts of a chosen length), `server` (start, wait, stop, restart, what it reports),
`upstreams` (a second, different engine one region away), `facts` (`python -m
bench.engine.facts`: the measurements docs/engine.md quotes).
"""
