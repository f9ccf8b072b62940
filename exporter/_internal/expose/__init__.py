"""Stage 3 of the data path, exposition: the store as Prometheus reads it.

`text` renders the text format and OpenMetrics (byte-identical to prometheus_client, each
series' lines cached between scrapes), `protobuf` the delimited protobuf format with native
buckets (`native`); `families` is the same content as prometheus_client families (the
collector); `debut` shows a scraper each new series at zero first. `server` serves it all over
HTTP (`http_thread`, bounded by `connection_guard`).
"""
