"""Who may push to and scrape `ttft-exporter serve`: bearer tokens, basic auth, TLS.

Secrets come from files named in the config (or, for the push token, the env var
TTFT_EXPORTER_PUSH_TOKEN) and are compared in constant time. /push takes a bearer token when one
is set; /metrics a bearer token or basic auth when set; /healthz never asks (probes). `serve`
beyond loopback with no push token is refused unless the config says
`aggregator.allow_unauthenticated_push: true` (`open_push_problem`).

The files are read at start (a missing or empty file is a config error naming its key) and again
whenever they change, so a rotated token or a renewed certificate needs no restart: each is
looked at (one `stat`) at most every RELOAD_CHECK_SECONDS when used, and read again when its
inode, size or modification time moved (a Kubernetes Secret volume swaps a symlink: a new
inode). A new token replaces the old one at once. A new certificate is a new TLS context that
connections made from then on get (the server's context hands each handshake the current one),
so a connection never sees half a rotation. A file that cannot be read or is empty after a
change keeps the previous value (logged): a rotation caught halfway locks nobody out.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import os
import ssl
import time
from pathlib import Path
from typing import Callable, Generic, TypeVar

from ..config.settings import Config, ConfigError
from .push import ENV_TOKEN

log = logging.getLogger("exporter.access")

PUSH_TOKEN, METRICS_TOKEN, METRICS_PASSWORD = (
    "aggregator.push_token_file", "aggregator.metrics_token_file",
    "aggregator.metrics_password_file")
#: The longest a changed secret or certificate file goes unnoticed (while it is used).
RELOAD_CHECK_SECONDS = 2.0

T = TypeVar("T")


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


def is_loopback(addr: str) -> bool:
    """True for an address only this host can reach (127.0.0.0/8, ::1, localhost)."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def open_push_problem(config: Config, addr: str) -> str | None:
    """Why `serve` on `addr` must not start: /push would take anyone's pushes (no token, beyond
    loopback, not explicitly allowed); None when it may."""
    agg = config.aggregator
    if agg.push_token_file or os.environ.get(ENV_TOKEN, "").strip() or \
            agg.allow_unauthenticated_push or is_loopback(addr):
        return None
    return (f"not set, and serve listens on {addr or 'every address'} beyond loopback, where "
            f"anyone who reaches the port could push forged calls (fire or hide pages): give "
            f"/push a token (this file, or the env var {ENV_TOKEN}), or set "
            f"aggregator.allow_unauthenticated_push: true on a network you trust")


class Watched(Generic[T]):
    """A value made from files, made again when one of them changes (looked at, with a `stat`
    per file, at most every `every` seconds, when the value is used)."""

    def __init__(self, paths: tuple[str, ...], make: Callable[[], T], what: str,
                 every: float = RELOAD_CHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.paths, self.what = paths, what
        self._make, self._every, self._clock = make, every, clock
        self._signature = self._stat()  # before reading: a change during the read is seen later
        self.value = make()  # ConfigError at start: the files are unusable
        self._checked = clock()

    def current(self) -> T:
        now = self._clock()
        if now - self._checked >= self._every:
            self._checked = now
            self._refresh()
        return self.value

    def _stat(self) -> tuple[tuple[int, int, int, int], ...] | None:
        try:
            return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)
                         for s in map(os.stat, self.paths))
        except OSError:
            return None

    def _refresh(self) -> None:
        signature = self._stat()
        if signature == self._signature:
            return
        self._signature = signature
        try:
            self.value = self._make()
        except ConfigError as e:  # caught halfway through a rotation: keep the previous one
            log.warning("ttft-exporter serve: %s changed but cannot be used; keeping the "
                        "previous one: %s", self.what, e)
            return
        log.info("ttft-exporter serve: %s reloaded from %s", self.what, ", ".join(self.paths))


class Access:
    """The aggregator's credentials and TLS context, from its config, followed as their files
    change."""

    def __init__(self, config: Config, every: float = RELOAD_CHECK_SECONDS):
        agg = config.aggregator
        self.config = config
        self._secrets = {key: Watched((path,), lambda p=path, k=key: read_secret(p, k), key,
                                      every)
                         for key, path in secret_files(config).items()}
        self._env_push_token = os.environ.get(ENV_TOKEN, "").strip()
        self._metrics_username = agg.metrics_username
        self._tls: Watched[ssl.SSLContext] | None = None
        self._every = every
        self._server_context: ssl.SSLContext | None = None

    def _secret(self, key: str) -> str:
        watched = self._secrets.get(key)
        return watched.current() if watched is not None else ""

    @property
    def push_token(self) -> str:
        """The token /push requires now ("" for none)."""
        return self._secret(PUSH_TOKEN) or self._env_push_token

    def push_authorized(self, authorization: str) -> bool:
        token = self.push_token
        if not token:
            return True
        return _bearer_matches(authorization, token)

    def metrics_authorized(self, authorization: str) -> bool:
        token = self._secret(METRICS_TOKEN)
        if not token and not self._metrics_username:
            return True
        if token and _bearer_matches(authorization, token):
            return True
        if self._metrics_username and authorization[:6].lower() == "basic ":
            try:
                user, _, password = base64.b64decode(authorization[6:].strip(), validate=True
                                                     ).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            want_password = self._secret(METRICS_PASSWORD)
            user_ok = hmac.compare_digest(user.encode(), self._metrics_username.encode())
            return hmac.compare_digest(password.encode(), want_password.encode()) and user_ok
        return False

    def metrics_challenge(self) -> str:
        return 'Basic realm="ttft-exporter"' if self._metrics_username else \
            'Bearer realm="ttft-exporter"'

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (None for plain HTTP): each handshake gets the context of
        the certificate files as they are now."""
        agg = self.config.aggregator
        if not agg.tls_cert_file:
            return None
        if self._server_context is None:
            self._tls = Watched((agg.tls_cert_file, agg.tls_key_file),
                                lambda: server_ssl_context(self.config),  # type: ignore[arg-type]
                                "aggregator.tls_cert_file", self._every)
            self._server_context = self._tls.value
            self._server_context.sni_callback = self._current_certificate
        return self._server_context

    def _current_certificate(self, connection: ssl.SSLObject, server_name: str | None,
                             context: ssl.SSLContext) -> None:
        """SNI callback (called on every handshake, with or without SNI): switch the connection
        to the newest certificate's context."""
        try:
            assert self._tls is not None
            current = self._tls.current()
            if current is not context:
                connection.context = current
        except Exception:  # never fail a handshake over a reload: the connection keeps `context`
            log.exception("ttft-exporter serve: cannot switch to the renewed certificate")
        return None


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
