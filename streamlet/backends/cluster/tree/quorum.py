"""Whether the coordination service serves: each ZooKeeper member of a connect string asked for its mode.

A member answers ZooKeeper's ``srvr`` command with ``Mode: leader``,
``follower`` or ``standalone`` while it serves; one that does not answer,
or answers without serving (it has no quorum), is ``down``. An ensemble
serves while a majority of its members do. ``cluster status`` and the
dashboard show each member's mode, and say so when there is no quorum.
A member reached on its TLS client port is asked over TLS (``tls``: the
asking process's certificate).
"""

from __future__ import annotations

import socket
import ssl

from streamlet.errors import NoQuorum

SERVING = ("leader", "follower", "standalone")
# seconds a member has to answer ``srvr``: a JVM on a busy host can take over a second, and a live member
# called "down" is a wrong answer; a member that is really gone refuses the connection at once.
MODE_TIMEOUT = 3.0


def four_letter_word(
    host: str, port: int, word: str = "ruok", timeout: float = 1.0, tls: ssl.SSLContext | None = None
) -> str:
    """Send a ZooKeeper four-letter command and return the answer (``"imok"`` for ``ruok``); over TLS with
    ``tls`` (a member's secure client port)."""
    with socket.create_connection((host, port), timeout=timeout) as plain:
        if tls is None:
            return _ask(plain, word)
        with tls.wrap_socket(plain, server_hostname=None) as private:
            return _ask(private, word)


def _ask(connection: socket.socket, word: str) -> str:
    connection.sendall(word.encode())
    answer = b""
    while len(answer) < 4096 and (chunk := connection.recv(1024)):  # the member closes after answering
        answer += chunk
    return answer.decode(errors="replace")


def member_mode(host: str, port: int, tls: ssl.SSLContext | None = None) -> str:
    """The mode a ZooKeeper server at ``host:port`` reports (``srvr``), or ``down``."""
    try:
        answer = four_letter_word(host, port, "srvr", timeout=MODE_TIMEOUT, tls=tls)
    except OSError:  # ssl.SSLError included: a member that refuses us serves nothing we can use
        return "down"
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return "down"  # "This ZooKeeper instance is not currently serving requests": it has no quorum


def member_modes(connect_string: str, tls: ssl.SSLContext | None = None) -> list[tuple[str, str]]:
    """Each member of ``connect_string`` (``h1:p1,h2:p2``) and its mode, in the string's order."""
    found = []
    for address in connect_string.split("/", 1)[0].split(","):
        host, _, port = address.strip().rpartition(":")
        found.append((address.strip(), member_mode(host, int(port), tls)))
    return found


def has_quorum(modes: list[tuple[str, str]]) -> bool:
    """Whether a majority of the members serve (a lone server: whether it serves)."""
    serving = sum(1 for _, mode in modes if mode in SERVING)
    return serving > len(modes) // 2


def describe_modes(modes: list[tuple[str, str]]) -> str:
    """``127.0.0.1:2181 leader, 127.0.0.1:2182 down``."""
    return ", ".join(f"{address} {mode}" for address, mode in modes)


def refuse_without_quorum(connect_string: str, tls: ssl.SSLContext | None = None) -> list[tuple[str, str]]:
    """Each member and its mode; :class:`~streamlet.errors.NoQuorum` naming them when a majority does not serve."""
    modes = member_modes(connect_string, tls)
    if not has_quorum(modes):
        serving = sum(1 for _, mode in modes if mode in SERVING)
        raise NoQuorum(
            f"the coordination service has no quorum: {serving} of {len(modes)} ZooKeeper members serve "
            f"({describe_modes(modes)})"
        )
    return modes
