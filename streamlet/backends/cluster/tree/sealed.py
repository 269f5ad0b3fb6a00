"""Job secrets: parameters sealed with a key derived from the cluster secret, opened only where the topology is
built (a worker's job part, the leader's build process, a client holding the secret).

``submit --secret-param NAME=@FILE`` reads a credential (a DSN with its password) from a file, hands it to the
function that builds the topology like any ``--param``, and records it in the spec sealed: AES-256-GCM under a
key derived (HKDF-SHA256) from the cluster secret, the submission's ``uid`` and the parameter's name as
associated data, so a sealed value cannot be moved to another job or parameter unnoticed. ZooKeeper, the logs,
the dashboard and ``jobs`` only ever see the sealed bytes or the name; whoever holds the cluster secret can
open them, as they can run any code on the cluster.

Example:
    >>> sealed = seal({"dsn": "postgresql://app:S3cret@db/shop"}, b"k" * 32, "u1")
    >>> "S3cret" in str(sealed)
    False
    >>> opened({"uid": "u1", "sealed": sealed}, b"k" * 32)
    {'dsn': 'postgresql://app:S3cret@db/shop'}
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from streamlet.errors import SpecError

_INFO = b"streamlet job secrets v1"
_NONCE = 12


def _key(secret: bytes) -> AESGCM:
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret))


def _bound(uid: str, name: str) -> bytes:
    return f"{uid}\0{name}".encode()


def seal(values: Mapping[str, str], secret: bytes, uid: str) -> dict[str, str]:
    """Each value sealed for the submission ``uid``: name -> base64 of nonce and ciphertext."""
    key = _key(secret)
    sealed = {}
    for name, value in values.items():
        nonce = os.urandom(_NONCE)
        sealed[name] = base64.b64encode(nonce + key.encrypt(nonce, value.encode(), _bound(uid, name))).decode()
    return sealed


def opened(spec: Mapping[str, Any], secret: bytes | None) -> dict[str, str]:
    """The spec's sealed parameters in clear (none sealed: ``{}``); without the secret, or with another, or
    moved from another submission or name, a :class:`SpecError` that names the parameter."""
    sealed: Mapping[str, str] = spec.get("sealed") or {}
    if not sealed:
        return {}
    if secret is None:
        raise SpecError(f"the job's secret parameters ({', '.join(sorted(sealed))}) open with the cluster secret only")
    key, uid = _key(secret), str(spec.get("uid", ""))
    found = {}
    for name, blob in sealed.items():
        data = base64.b64decode(blob)
        try:
            found[name] = key.decrypt(data[:_NONCE], data[_NONCE:], _bound(uid, name)).decode()
        except InvalidTag:
            raise SpecError(
                f"secret parameter '{name}' does not open: sealed with another cluster secret, or for another job"
            ) from None
    return found


def with_secrets_opened(spec: Mapping[str, Any], secret: bytes | None) -> dict[str, Any]:
    """A copy of ``spec`` whose ``params`` hold its sealed parameters in clear (for a build process of ours,
    handed over a pipe: never written anywhere)."""
    return {**spec, "params": {**(spec.get("params") or {}), **opened(spec, secret)}, "sealed": {}}
