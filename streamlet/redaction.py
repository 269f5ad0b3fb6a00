"""Secrets kept out of what streamlet shows: a database password, in any text that names a connection.

A PostgreSQL DSN carries its password in one of two places, in either of libpq's forms: the URL's user
information (``postgresql://user:secret@host/db``) or a parameter (``?password=secret`` in a URL,
``password=secret`` or ``password='s e c'`` in a ``key=value`` string), and so does the password of a
client key (``sslpassword``). :func:`redacted` masks every one of them in a DSN, and :func:`scrub` in any
text that may quote one (an error message, a failure reason, a log line): what the dashboard, ``jobs``,
``cluster status`` and the logs show goes through it.

Example:
    >>> redacted("postgresql://app:p@ss@db:5432/shop?sslmode=require&password=S3cret")
    'postgresql://app:***@db:5432/shop?sslmode=require&password=***'
    >>> redacted("host=db user=app password='it is me' dbname=shop")
    'host=db user=app password=*** dbname=shop'
    >>> scrub("PostgreSQL at postgres://u:x@h/db not reachable")
    'PostgreSQL at postgres://u:***@h/db not reachable'
"""

from __future__ import annotations

import re

MASK = "***"

#: A DSN in URL form, up to the first blank or quote (what ends it in a sentence or a repr).
_URL = re.compile(r"postgres(?:ql)?://[^\s'\"]*", re.IGNORECASE)
#: A secret parameter, in a URL's query or a key=value string: a quoted value (with \' escapes) or a bare one.
_SECRET_PARAMETER = re.compile(
    r"(?<![\w.-])(password|sslpassword)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'\"#]*)", re.IGNORECASE
)


def redacted(dsn: str) -> str:
    """``dsn`` (URL or ``key=value`` form) with every password and client-key password replaced by ``***``."""
    return scrub(dsn)


def scrub(text: str) -> str:
    """``text`` with the password of every DSN it quotes masked (see the module docstring)."""
    text = _URL.sub(lambda found: _without_userinfo_password(found.group(0)), text)
    return _SECRET_PARAMETER.sub(lambda found: f"{found.group(1)}{found.group(2)}{MASK}", text)


def _without_userinfo_password(url: str) -> str:
    """The URL with the password of its user information masked. The user information ends at the *last*
    ``@`` before the query (``?``) or fragment (``#``), so a password holding ``@`` or ``/`` is masked whole."""
    scheme, _, rest = url.partition("://")
    query = min((rest.index(mark) for mark in "?#" if mark in rest), default=len(rest))
    userinfo, at, remainder = rest[:query].rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:{MASK}@{remainder}{rest[query:]}"
