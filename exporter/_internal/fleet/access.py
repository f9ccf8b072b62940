"""Who may push to and scrape `ttft-exporter serve`: bearer tokens, basic auth, TLS.

Secrets come from files named in the config (or, for the push token, the env var
TTFT_EXPORTER_PUSH_TOKEN), are read once at start (a missing or empty file is a config error
naming its key) and compared in constant time. /push takes a bearer token when one is set;
/metrics a bearer token or basic auth when set; /healthz never asks (probes).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import ssl
from pathlib import Path

from ..config.settings import Config, ConfigError
from .push import ENV_TOKEN


PUSH_TOKEN, METRICS_TOKEN, METRICS_PASSWORD = (
    "aggregator.push_token_file", "aggregator.metrics_token_file",
    "aggregator.metrics_password_file")


def secret_files(config: Config) -> dict[str, str]:
    """The secret files the config uses, by key."""
    agg = config.aggregator
    files = {PUSH_TOKEN: agg.push_token_file, METRICS_TOKEN: agg.metrics_token_file,
             METRICS_PASSWORD: agg.metrics_password_file if agg.metrics_username else ""}
    return {key: path for key, path in files.items() if path}


def problems(config: Config) -> list[tuple[str, str]]:
    """Everything `Access(config)` and its TLS context would refuse, all at once, as
    (key, reason) pairs (check-config)."""
    out: list[tuple[str, str]] = []
    for key, path in secret_files(config).items():
        try:
            read_secret(path, key)
        except ConfigError as e:
            out += e.errors
    try:
        server_ssl_context(config)
    except ConfigError as e:
        out += e.errors
    return out


class Access:
    """The aggregator's credentials and TLS context, from its config."""

    def __init__(self, config: Config):
        agg = config.aggregator
        self.config = config
        secrets = {key: read_secret(path, key) for key, path in secret_files(config).items()}
        self.push_token = secrets.get(PUSH_TOKEN) or os.environ.get(ENV_TOKEN, "").strip()
        self.metrics_token = secrets.get(METRICS_TOKEN, "")
        self.metrics_basic: tuple[str, str] | None = None
        if agg.metrics_username:
            self.metrics_basic = (agg.metrics_username, secrets[METRICS_PASSWORD])

    def push_authorized(self, authorization: str) -> bool:
        if not self.push_token:
            return True
        return _bearer_matches(authorization, self.push_token)

    def metrics_authorized(self, authorization: str) -> bool:
        if not self.metrics_token and self.metrics_basic is None:
            return True
        if self.metrics_token and _bearer_matches(authorization, self.metrics_token):
            return True
        if self.metrics_basic is not None and authorization[:6].lower() == "basic ":
            try:
                user, _, password = base64.b64decode(authorization[6:].strip(), validate=True
                                                     ).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            want_user, want_password = self.metrics_basic
            user_ok = hmac.compare_digest(user.encode(), want_user.encode())
            return hmac.compare_digest(password.encode(), want_password.encode()) and user_ok
        return False

    def metrics_challenge(self) -> str:
        return 'Basic realm="ttft-exporter"' if self.metrics_basic else \
            'Bearer realm="ttft-exporter"'

    def ssl_context(self) -> ssl.SSLContext | None:
        return server_ssl_context(self.config)


def server_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The server's TLS context from `tls_cert_file`/`tls_key_file`, or None for plain HTTP."""
    agg = config.aggregator
    if not agg.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(agg.tls_cert_file, agg.tls_key_file)
    except (OSError, ssl.SSLError) as e:
        why = getattr(e, "strerror", None) or e
        raise ConfigError("config", [("aggregator.tls_cert_file",
                                      f"cannot load {agg.tls_cert_file} and "
                                      f"{agg.tls_key_file}: {why}")]) from None
    return context


def _bearer_matches(authorization: str, token: str) -> bool:
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


def read_secret(path: str, key: str) -> str:
    """The stripped content of a secret file named in the config; ConfigError when unusable."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError("config", [(key, f"cannot read {path}: {e.strerror or e}")]) from None
    if not value:
        raise ConfigError("config", [(key, f"{path} is empty")])
    return value
