"""Who may read the dashboard and a worker's ``/metrics``: anyone on loopback; elsewhere, a bearer token.

Both listen on 127.0.0.1 by default. Bound to any other address
(``--dashboard-host``, a worker's ``--host`` with ``--metrics-port``) they
answer only requests that carry the token of the state directory's
``monitor-token`` file (made 0600 on first use): ``Authorization: Bearer
<token>``, as Prometheus sends with ``authorization: {credentials_file: ...}``.
A browser opens the dashboard once as ``/?token=<token>``, which sets an
HttpOnly, same-site cookie its page's requests then carry (the dashboard's
middleware is in :mod:`~streamlet.backends.monitor.server`: this module
imports no aiohttp, a worker does not load it).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

TOKEN_FILE = "monitor-token"
COOKIE = "streamlet_token"


def needs_token(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from other machines (anything but loopback)."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return True


def load_or_make_token(path: Path) -> str:
    """The token in ``path``; a new one written there (0600 from the first byte) when there is none."""
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
        return token


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (compared in constant time)."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and same_token(given.strip(), token)


def same_token(given: str, token: str) -> bool:
    """``given == token``, in constant time."""
    return hmac.compare_digest(given.encode(), token.encode())


def wsgi_guard(app: Callable[..., Iterable[bytes]], token: str) -> Callable[..., Iterable[bytes]]:
    """A WSGI app (prometheus_client's) that answers 401 unless the request carries the bearer token."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if bearer_matches(environ.get("HTTP_AUTHORIZATION"), token):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
        return [b"these metrics need their token: 'Authorization: Bearer <token>'\n"]

    return guarded
