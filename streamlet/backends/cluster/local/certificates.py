"""The cluster's own certificate authority and a certificate per process (the ``cryptography`` library).

``cluster up`` makes them under ``<state dir>/tls/``: ``ca.pem`` (the cluster CA's certificate, which every
process trusts and nothing else), ``ca.key`` (kept only where certificates are issued), and for each process
``<id>.pem`` and ``<id>.key``. A process certificate names its process id (its subject's common name and its
one DNS name, e.g. ``worker-0``): a worker's peers check that the worker they reach is the one they meant.
Every key and certificate file is written 0600 from the start.

Keys are ECDSA P-256 (fast handshakes); certificates last ``DAYS`` days and a process warns
``WARN_DAYS`` ahead of its own expiry. Rotating: issue new certificates (same CA, or a new CA trusted beside
the old one for a while) and restart the processes one at a time; see the operations docs.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from streamlet.errors import ClusterError
from streamlet.transport.tls import TlsSettings

log = structlog.get_logger("streamlet")

DAYS = 365  # a process certificate's life
CA_DAYS = 3650
WARN_DAYS = 30  # a process warns this long before its certificate expires
TLS_FOLDER = "tls"
CA_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)  # it signs certificates, nothing else


@dataclass(frozen=True)
class ProcessFiles:
    """One process's TLS files: the CA certificate it trusts, its certificate and its key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def of(cls, folder: Path, process_id: str) -> ProcessFiles:
        """The files of ``process_id`` in a ``tls/`` folder."""
        return cls(folder / "ca.pem", folder / f"{process_id}.pem", folder / f"{process_id}.key")

    def exist(self) -> bool:
        """Whether all three are there."""
        return self.ca.exists() and self.cert.exists() and self.key.exists()


def make_ca(folder: Path, cluster: str) -> None:
    """A new cluster CA in ``folder`` (``ca.pem``, ``ca.key``), unless one is there."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    if (folder / "ca.pem").exists():
        return
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"streamlet cluster {cluster} CA")])
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    _write(folder / "ca.key", _key_bytes(key))
    _write(folder / "ca.pem", certificate.public_bytes(serialization.Encoding.PEM))


def issue(folder: Path, process_id: str, days: int = DAYS) -> ProcessFiles:
    """A certificate for ``process_id`` signed by the CA in ``folder`` (replacing one it had), for both ends
    of a connection (it serves and it connects)."""
    ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ClusterError(f"{folder / 'ca.key'} is not the cluster CA's key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, process_id)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(process_id)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = ProcessFiles.of(folder, process_id)
    _write(files.key, _key_bytes(key))
    _write(files.cert, certificate.public_bytes(serialization.Encoding.PEM))
    return files


def zookeeper_files(folder: Path, member: str, into: Path) -> None:
    """A certificate for ZooKeeper member ``member`` from the CA in ``folder``, written where the member's
    ``zoo.cfg`` reads it: ``into/keystore.pem`` (its key, then its certificate: ZooKeeper's PEM key store)
    and ``into/ca.pem``, both 0600."""
    files = issue(folder, member)
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o700)
    _write(into / "keystore.pem", files.key.read_bytes() + files.cert.read_bytes())
    _write(into / "ca.pem", files.ca.read_bytes())


def process_tls(folder: Path, process_id: str) -> TlsSettings:
    """The TLS settings ``process_id`` runs with, from ``folder``: its certificate, issued now by the cluster CA
    when the CA's key is in ``folder`` (the machine ``cluster up`` ran on) and it has none yet; a warning when
    it expires within ``WARN_DAYS``; a :class:`ClusterError` saying what to do when there is none."""
    files = ProcessFiles.of(folder, process_id)
    if not files.exist() and files.ca.exists() and (folder / "ca.key").exists():
        issue(folder, process_id)
    if not files.exist():
        raise ClusterError(
            f"no TLS certificate for {process_id} in {folder} (it needs ca.pem, {process_id}.pem and "
            f"{process_id}.key, 0600): copy them from where the cluster CA is, or run with --no-tls on every "
            "process (cleartext: for a loopback-only cluster)"
        )
    left = days_left(files.cert)
    if left < WARN_DAYS:
        log.warning("TLS certificate expires soon", process=process_id, days_left=round(left, 1), cert=str(files.cert))
    return TlsSettings(files.ca, files.cert, files.key)


def days_left(cert: Path) -> float:
    """Days until the certificate in ``cert`` expires (negative once it has)."""
    certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    return (certificate.not_valid_after_utc - _now()).total_seconds() / 86_400


def named(cert: Path) -> list[str]:
    """The DNS names the certificate in ``cert`` carries (a process certificate: its process id)."""
    certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(names.get_values_for_type(x509.DNSName))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only from the first byte (replacing a file there)."""
    temporary = path.with_name(f".{path.name}.new")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)  # a process reading it sees the old file or the new one, never half
