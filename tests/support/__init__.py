"""Helpers shared by the test suite (a real Prometheus server, ...)."""
