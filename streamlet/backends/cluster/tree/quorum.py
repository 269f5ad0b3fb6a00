"""Whether the coordination service serves: each ZooKeeper member of a connect string asked for its mode.

A member answers ZooKeeper's ``srvr`` command with ``Mode: leader``,
``follower`` or ``standalone`` while it serves; one that does not answer,
or answers without serving (it has no quorum), is ``down``. An ensemble
serves while a majority of its members do. ``cluster status`` and the
dashboard show each member's mode, and say so when there is no quorum.
"""

from __future__ import annotations

import socket

from streamlet.errors import NoQuorum

SERVING = ("leader", "follower", "standalone")


def four_letter_word(host: str, port: int, word: str = "ruok", timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command and return the answer (``"imok"`` for ``ruok``)."""
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.sendall(word.encode())
        return connection.recv(1024).decode(errors="replace")


def member_mode(host: str, port: int) -> str:
    """The mode a ZooKeeper server at ``host:port`` reports (``srvr``), or ``down``."""
    try:
        answer = four_letter_word(host, port, "srvr")
    except OSError:
        return "down"
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return "down"  # "This ZooKeeper instance is not currently serving requests": it has no quorum


def member_modes(connect_string: str) -> list[tuple[str, str]]:
    """Each member of ``connect_string`` (``h1:p1,h2:p2``) and its mode, in the string's order."""
    found = []
    for address in connect_string.split("/", 1)[0].split(","):
        host, _, port = address.strip().rpartition(":")
        found.append((address.strip(), member_mode(host, int(port))))
    return found


def has_quorum(modes: list[tuple[str, str]]) -> bool:
    """Whether a majority of the members serve (a lone server: whether it serves)."""
    serving = sum(1 for _, mode in modes if mode in SERVING)
    return serving > len(modes) // 2


def describe_modes(modes: list[tuple[str, str]]) -> str:
    """``127.0.0.1:2181 leader, 127.0.0.1:2182 down``."""
    return ", ".join(f"{address} {mode}" for address, mode in modes)


def refuse_without_quorum(connect_string: str) -> list[tuple[str, str]]:
    """Each member and its mode; :class:`~streamlet.errors.NoQuorum` naming them when a majority does not serve."""
    modes = member_modes(connect_string)
    if not has_quorum(modes):
        serving = sum(1 for _, mode in modes if mode in SERVING)
        raise NoQuorum(
            f"the coordination service has no quorum: {serving} of {len(modes)} ZooKeeper members serve "
            f"({describe_modes(modes)})"
        )
    return modes
