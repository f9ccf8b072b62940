"""The exporter's private implementation. Nothing here is a public API: import from `exporter`
(the functions of the public API) or `exporter.integrations` (middleware, trace helpers, the
OpenTelemetry views, the config types) instead; names and modules here change without notice.
"""
