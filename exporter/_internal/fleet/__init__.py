"""Stage 4 of the data path, the fleet: many worker processes, one exact scrape target.

A push worker drains its store and sends the deltas (`push`) in the wire format (`wire`, whose
histograms travel in HdrHistogram's own encoding, `codec`); `ttft-exporter serve` validates and
merges them exactly (`aggregator`), keeps them across restarts (`journal`) and checks who may
push and scrape (`access`).
"""
