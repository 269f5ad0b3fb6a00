"""Mutual TLS for the data plane: both ends show a certificate of the cluster's own CA, and nothing else.

A :class:`TlsSettings` holds a process's files (the CA certificate it trusts, its certificate and key, see
``backends.cluster.local.certificates``). The data server accepts plain TCP and starts TLS in its handler
(server side, a client certificate required, :data:`TLS_HANDSHAKE_TIMEOUT`), so that every refused handshake is
seen and counted; asyncio's ``start_server(ssl=...)`` would drop it unseen. A client that knows which process
it means (``peer``) checks that the server's certificate names it (the certificate's DNS name is the process
id, as a host name would be); one that does not takes any process of the cluster. Under TLS 1.3 a client
learns that the server refused its certificate only when it first reads, which is why a link counts as up
only after the server's first frame (its HELLO).

The HMAC handshake runs inside TLS as before: the secret still decides who may send, the certificates who
a process is, and TLS hides and seals every frame.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# seconds a peer has to complete the TLS handshake: each step waits for a turn of both loops, which a long call of
# user code (a plain def execute computing for seconds) may delay by that long
TLS_HANDSHAKE_TIMEOUT = 15.0


@dataclass(frozen=True)
class TlsSettings:
    """A process's TLS files: ``ca`` (the cluster CA certificate), ``cert`` and ``key`` (its own)."""

    ca: Path
    cert: Path
    key: Path
    _contexts: dict[str, tuple[tuple[int, ...], ssl.SSLContext]] = field(
        default_factory=dict, compare=False, repr=False
    )  # kind -> (the files' change times it was built from, the context)

    def server_context(self) -> ssl.SSLContext:
        """TLS 1.3, a client certificate of the cluster CA required."""
        return self._context("server", ssl.PROTOCOL_TLS_SERVER, check_name=False)

    def client_context(self, check_name: bool, minimum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3) -> ssl.SSLContext:
        """``minimum`` (TLS 1.3) or later with this process's certificate; ``check_name``: the server's must
        name the peer meant."""
        kind = f"client:{check_name}:{minimum.name}"
        return self._context(kind, ssl.PROTOCOL_TLS_CLIENT, check_name=check_name, minimum=minimum)

    def _context(
        self, kind: str, protocol: int, check_name: bool, minimum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ) -> ssl.SSLContext:
        """The context for ``kind``, built again when a file changed since (rotated certificates: the next
        connection uses them, links up now stay up)."""
        stamp = tuple(path.stat().st_mtime_ns for path in (self.ca, self.cert, self.key))
        found = self._contexts.get(kind)
        if found is not None and found[0] == stamp:
            return found[1]
        context = ssl.SSLContext(protocol)
        context.minimum_version = minimum
        context.load_cert_chain(self.cert, self.key)
        context.load_verify_locations(cafile=self.ca)
        context.verify_mode = ssl.CERT_REQUIRED
        context.check_hostname = check_name
        self._contexts[kind] = (stamp, context)
        return context


def peer_name(ssl_object: Any) -> str | None:
    """The process id the peer's certificate names (its first DNS name), from a connection's ``ssl_object``."""
    if ssl_object is None:
        return None
    certificate = ssl_object.getpeercert()
    for kind, value in (certificate or {}).get("subjectAltName", ()):
        if kind == "DNS":
            return str(value)
    return None
