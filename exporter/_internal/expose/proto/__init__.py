"""Prometheus client data model (prometheus/client_model), generated: see README.md."""
