"""The demo provider's farther region: the same API behind TLS, `one_way` seconds away.

The route-change incident (incidents.py) silently sends one model's calls here. On loopback the
kernel completes a TCP connect at once whatever the server does, so the distance is emulated
where a client sees it: a relay in front of a TLS listener holds every byte `one_way` seconds in
each direction. The TLS handshake, the last step of the connect phase, then takes a round trip
longer, and a request a round trip longer before its headers (the server phase); tokens keep
their pace, so no model time changes. The far listener closes each connection after its
response, as a load balancer with a short idle timeout does, so every call pays the connect.

The certificate is self-signed at start (the `cryptography` package, else the openssl command);
`tls_client_context()` trusts it.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import ipaddress
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from ..expose import http_thread
from .relay import Relay

#: Half the round trip to the far region (seconds).
ONE_WAY_SECONDS = 0.05


def tls_available() -> bool:
    """True when a certificate can be made here (cryptography installed, or openssl)."""
    if importlib.util.find_spec("cryptography") is not None:
        return True
    return shutil.which("openssl") is not None


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, valid for a week, that is its own CA (cryptography, else
    the openssl command); also the TLS tests' certificate."""
    cert, key = directory / "far.crt", directory / "far.key"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "7", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)], check=True,
                       capture_output=True)
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key


@dataclass
class FarRegion:
    """The far region serving on the running loop; `close()` stops it."""

    base_url: str
    ca_file: Path
    _runner: web.AppRunner
    _relay: Relay
    _directory: tempfile.TemporaryDirectory[str]

    def tls_client_context(self) -> ssl.SSLContext:
        """A client TLS context trusting the far region's certificate."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._relay.close()
        await self._runner.cleanup()
        self._directory.cleanup()


async def start_far_region(app: web.Application, one_way: float = ONE_WAY_SECONDS,
                           shutdown_timeout: float = 1.0) -> FarRegion:
    """Serve `app` over TLS on loopback behind a relay that adds `one_way` each way."""
    directory = tempfile.TemporaryDirectory(prefix="ttft-demo-far-")
    cert, key = self_signed(Path(directory.name))
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    runner, tls_port = await http_thread.serve(app, "127.0.0.1", 0, ssl_context=server_tls,
                                               shutdown_timeout=shutdown_timeout)

    relay = await Relay(tls_port, one_way).start()
    port = relay.port
    return FarRegion(http_thread.base_url("127.0.0.1", port, tls=True), cert, runner, relay,
                     directory)
