"""Stage 6 of the data path, the diagnosis: which failure made TTFT rise.

`causes` holds the decision (the signals that tell a prefill surge, a cold cache, a noisy
neighbour and a route change apart, their thresholds, `classify`); `run` is `ttft-exporter
diagnose`, which reads the signals from Prometheus's HTTP API and applies it; `watch` is
`ttft-exporter watch`, which applies it every interval and serves the finding to Prometheus for
the `LLMTTFTLikelyCause` alert (one decision for both).
"""
