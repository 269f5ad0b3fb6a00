"""The HELLO handshake: mutual HMAC-SHA256 challenge-response over a shared cluster secret.

1. server -> client: ``HELLO ["challenge", server_nonce]``
2. client -> server: ``HELLO ["response", client_nonce, hmac(secret, "client" + server_nonce + client_nonce)]``
3. server -> client: ``HELLO ["welcome", hmac(secret, "server" + client_nonce + server_nonce)]``

Until step 2 checks out the server accepts nothing but a small HELLO; a
peer that fails is disconnected before any DATA frame is parsed.
"""

from __future__ import annotations

import hashlib
import hmac

from streamlet.core.model import world

NONCE_BYTES = 16
HELLO_MAX = 1024  # bytes a frame may have before the peer is authenticated


def nonce() -> bytes:
    """A fresh random challenge."""
    return world.token_bytes(NONCE_BYTES)


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the client sends to prove it knows ``secret``."""
    return hmac.digest(secret, b"client" + server_nonce + client_nonce, hashlib.sha256)


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the server sends back to prove it knows ``secret`` too."""
    return hmac.digest(secret, b"server" + client_nonce + server_nonce, hashlib.sha256)


def matches(expected: bytes, received: object) -> bool:
    """Constant-time comparison that also refuses a non-bytes answer."""
    return isinstance(received, bytes) and hmac.compare_digest(expected, received)
