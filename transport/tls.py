"""TLS material: a development CA and server certificate, and QUIC configurations that use them.

Certificate verification is on by default; the client pins the CA. `insecure=True` turns
verification off for local experiments only and says so loudly.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from netsense.errors import ConfigError

from .auth import write_secret
from .localpeer import PeerQuicConfiguration
from .sensing.congestion import SENSING_CC  # importing registers the sensing controllers with aioquic
from .wire import ALPN

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CertPaths:
    """Where `make_dev_certs` puts its files."""

    ca: Path
    """CA certificate (workers pin it)."""
    cert: Path
    """Server certificate chain."""
    key: Path
    """Server private key."""
    secret: Path
    """Shared secret for worker authentication."""

    @classmethod
    def in_dir(cls, d: str | Path) -> CertPaths:
        d = Path(d)
        return cls(d / "ca.pem", d / "server.pem", d / "server.key", d / "secret")


LOOPBACK_MAX_DATAGRAM_SIZE = 8952
"""Packet payload used on loopback (MTU 64 KiB): ~100 MB/s vs ~37 MB/s at 1200 (docs/ARCHITECTURE.md)."""


@dataclass(frozen=True)
class TransportSettings:
    """QUIC knobs. Defaults follow aioquic as measured (docs/ARCHITECTURE.md): large windows, large
    datagrams on loopback."""

    max_datagram_size: int = 1200
    """UDP payload per packet; path MTU - 28 for IPv4 (aioquic has no PMTU discovery)."""
    local_max_datagram_size: int = LOOPBACK_MAX_DATAGRAM_SIZE
    """UDP payload per packet to a peer on this host (loopback or one of its own addresses), where
    it is larger than `max_datagram_size`: such traffic never leaves the host, and aioquic's CPU is
    per packet. 0: `max_datagram_size` for every peer (e.g. a WAN emulated on `lo`)."""
    max_data: int = 64 * 1024 * 1024
    """Connection flow-control window (aioquic's 1 MiB default throttles tensors)."""
    max_stream_data: int = 64 * 1024 * 1024
    """Per-stream flow-control window."""
    idle_timeout_s: float = 10.0
    """Close a connection after this long without packets; workers PING every third of it, so
    this is how long a dead PS (or a cut link) goes unnoticed. Raise it on links that black out
    for longer than this and should not count as dead."""
    socket_buffer_bytes: int = 8 * 1024 * 1024
    """SO_RCVBUF/SO_SNDBUF; every loss seen on loopback was a receive-buffer overflow."""
    udp_gso: bool = True
    """Send each transmit's runs of equal-size datagrams in one syscall (UDP segmentation offload,
    Linux); the receiver sees the same datagrams. Falls back by itself where the kernel or device
    refuses; off: one `sendto` a datagram."""
    congestion_control: str = SENSING_CC
    """aioquic congestion-control algorithm name; the default (Reno with delivery-rate sensing)
    is what the network signal and the adaptive policies read."""

    def __post_init__(self) -> None:
        if not self.idle_timeout_s > 0:  # also refuses NaN
            raise ConfigError(f"transport.idle_timeout_s must be > 0 seconds, got {self.idle_timeout_s}")
        if self.local_max_datagram_size and not 1200 <= self.local_max_datagram_size <= 65507:
            raise ConfigError(
                f"transport.local_max_datagram_size must be 0 or in 1200..65507, got {self.local_max_datagram_size}"
            )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )


def make_dev_certs(out: str | Path, hosts: list[str] | None = None, days: int = 365, *, force: bool = False) -> CertPaths:
    """Write a development CA, a server certificate for `hosts`, and a shared secret into `out`.

    Refuses (ConfigError) to replace existing files unless `force`: workers that were handed the
    old CA and secret could no longer connect."""
    if not isinstance(days, int) or days < 1:
        raise ConfigError(f"certificate validity must be >= 1 day, got {days!r}")
    hosts = hosts or ["localhost", "127.0.0.1", "::1"]
    paths = CertPaths.in_dir(out)
    existing = [p.name for p in (paths.ca, paths.cert, paths.key, paths.secret) if p.exists()]
    if existing and not force:
        raise ConfigError(
            f"{paths.ca.parent} already holds {', '.join(existing)}; refusing to overwrite them (workers holding "
            "the old CA and secret would be locked out): pass --force to replace them"
        )
    paths.ca.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("NetSense dev CA"))
        .issuer_name(_name("NetSense dev CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(paths.key, key)
    write_secret(paths.secret)
    return paths


def _base_config(settings: TransportSettings, *, is_client: bool) -> QuicConfiguration:
    return PeerQuicConfiguration(
        is_client=is_client,
        alpn_protocols=[ALPN],
        max_datagram_size=settings.max_datagram_size,
        local_max_datagram_size=settings.local_max_datagram_size,
        udp_gso=settings.udp_gso,
        max_data=settings.max_data,
        max_stream_data=settings.max_stream_data,
        idle_timeout=settings.idle_timeout_s,
        congestion_control_algorithm=settings.congestion_control,
    )


def server_configuration(cert: str | Path, key: str | Path, settings: TransportSettings) -> QuicConfiguration:
    """QUIC server configuration presenting `cert`."""
    config = _base_config(settings, is_client=False)
    try:
        config.load_cert_chain(str(cert), str(key))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load server certificate {cert} / key {key}: {exc}") from None
    return config


def client_configuration(
    settings: TransportSettings, *, ca: str | Path | None, server_name: str, insecure: bool = False
) -> QuicConfiguration:
    """QUIC client configuration that verifies the server against the pinned CA (unless insecure)."""
    config = _base_config(settings, is_client=True)
    config.server_name = server_name
    if insecure:
        log.warning("INSECURE: TLS certificate verification is OFF; use only for local experiments")
        config.verify_mode = ssl.CERT_NONE
        return config
    if ca is None:
        raise ConfigError("no CA file given: pass --ca (from `netsense certs`) or --insecure for local experiments")
    try:
        config.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load CA file {ca}: {exc}") from None
    return config
