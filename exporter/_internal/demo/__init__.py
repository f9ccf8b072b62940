"""The demo: a local provider-compatible LLM server with a latency model, and its load.

Lets `ttft-exporter demo`, the tests and the benchmarks exercise the real SDKs and show every
failure mode of README.md ("Why") without a network, a GPU or an API key.
"""
