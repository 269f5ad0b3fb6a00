"""Who may read a cluster's dashboard and a worker's ``/metrics``: whoever holds the state directory's token.

Both show job data (names, topologies, placements, failure reasons), which the
security model gives to holders of the cluster secret only, so both answer only
requests that carry the token of the state directory's ``monitor-token`` file
(made 0600 on first use), on every address, loopback too: any local user can
reach 127.0.0.1. ``Authorization: Bearer <token>`` (Prometheus: ``authorization:
{credentials_file: ...}``) or ``?token=<token>``. A browser opens the URL that
``cluster up`` and ``cluster status`` print, which ends in ``?token=...``
(:func:`with_token`): that sets an HttpOnly, same-site cookie its page's own
requests then carry (the dashboard's middleware is in
:mod:`~streamlet.backends.monitor.server`: this module imports no aiohttp, a
worker does not load it). The URL in ZooKeeper (``/dashboard``, readable by
anyone) holds no token.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

TOKEN_FILE = "monitor-token"
COOKIE = "streamlet_token"


def load_or_make_token(path: Path) -> str:
    """The token in ``path``; a new one written there (0600 from the first byte) when there is none."""
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process of the cluster made it meanwhile: theirs is the token
            return load_or_make_token(path)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
        return token


def with_token(url: str | None, state_dir: Path) -> str | None:
    """The dashboard's ``url`` with ``?token=`` of ``state_dir``'s token, to open as it is (unchanged when that
    state dir holds no token: the cluster was started elsewhere)."""
    if url is None:
        return None
    try:
        token = (state_dir / TOKEN_FILE).read_text(encoding="ascii").strip()
    except OSError:
        return url
    return f"{url}?token={token}" if token else url


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
