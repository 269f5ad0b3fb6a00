"""A ZooKeeper ensemble of 3 or 5 members on this machine: ``streamlet cluster up --zookeepers 3``.

Each member has a folder of its own under the state directory
(``zookeeper-<myid>/``: ``zoo.cfg``, ``data/myid``, its log) and its own
client, peer and election ports. Its command line names its configuration by
a path relative to that folder, so a member is started again from its
command line and working directory alone (``cluster.json`` records both),
as an operator's unit file would. The processes are stopped by PID.

A quorum serves while a majority of members do;
:func:`~streamlet.backends.cluster.tree.quorum.member_modes` asks each member
for its mode, which ``cluster status`` shows.

Example:
    >>> ensemble = ZooKeeperEnsemble(Path("/tmp/zk"), size=3)   # doctest: +SKIP
    >>> pids = [member.launch() for member in ensemble.prepare()]  # doctest: +SKIP
    >>> ensemble.wait_until_serving()                              # doctest: +SKIP
    >>> ensemble.connect_string                                    # doctest: +SKIP
    '127.0.0.1:40111,127.0.0.1:40113,127.0.0.1:40115'
"""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from streamlet.backends.cluster.local.zookeeper_server import CONNECTION_LIMIT, find_classpath, find_java, free_port
from streamlet.backends.cluster.tree.quorum import member_mode
from streamlet.errors import ZooKeeperError

QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TLS_KEYSTORE = "tls/keystore.pem"  # in a member's folder: its key and certificate
TLS_TRUSTSTORE = "tls/ca.pem"  # the cluster CA's certificate
SIZES = (3, 5)  # an even count adds no failure it survives; 1 is the standalone server
CONFIG = "zoo.cfg"


@dataclass
class EnsembleMember:
    """One member: ``myid``, its folder, its ports; ``process`` while this object started it."""

    myid: int
    folder: Path
    client_port: int
    peer_port: int
    election_port: int
    host: str = "127.0.0.1"
    secure_port: int | None = None  # a TLS client port on host (the plain one then serves 127.0.0.1 only)
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        """``zookeeper-1``: its id in ``cluster.json`` and its folder's name."""
        return f"zookeeper-{self.myid}"

    @property
    def address(self) -> str:
        """``host:port`` of the client port others connect to (its TLS one, when it has one)."""
        return f"{self.host}:{self.secure_port or self.client_port}"

    def command(self) -> list[str]:
        """The command line that starts it, run in :attr:`folder` (its configuration is ``./zoo.cfg``)."""
        return [
            find_java(), "-Xmx256m", "-cp", find_classpath(), "-Dzookeeper.log.dir=.",
            "-Dzookeeper.4lw.commands.whitelist=ruok,srvr,stat,mntr", QUORUM_MAIN, CONFIG,
        ]  # fmt: skip

    def launch(self) -> int:
        """Start the member (its folder and configuration written before); its PID."""
        with open(self.folder / "zookeeper.log", "ab") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        return self.process.pid

    def mode(self, tls: ssl.SSLContext | None = None) -> str:
        """``leader``, ``follower`` (``standalone`` for a lone server), or ``down``: not answering, or
        answering without serving (no quorum: "This ZooKeeper instance is not currently serving requests").
        A member with a TLS client port is asked there, with ``tls`` (the asking process's certificate)."""
        if self.secure_port is not None:
            return member_mode(self.host, self.secure_port, tls) if tls is not None else "down"
        return member_mode(self.host, self.client_port)


@dataclass
class ZooKeeperEnsemble:
    """``size`` members under ``state_dir`` (``zookeeper-1`` … ``zookeeper-<size>``), all on 127.0.0.1."""

    state_dir: Path
    size: int = 3
    tick_ms: int = 500  # sessions may be as short as 2 ticks: failure detection in seconds
    start_timeout: float = 60.0
    members: list[EnsembleMember] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ZooKeeperError(f"a ZooKeeper ensemble has 3 or 5 members, not {self.size}")

    @property
    def connect_string(self) -> str:
        """``h1:p1,h2:p2,h3:p3``: what every process takes as ``--zk``."""
        return ",".join(member.address for member in self.members)

    def prepare(self) -> list[EnsembleMember]:
        """Choose the ports and write every member's folder: ``zoo.cfg`` and ``data/myid``."""
        self.members = [
            EnsembleMember(myid, self.state_dir / f"zookeeper-{myid}", free_port(), free_port(), free_port())
            for myid in range(1, self.size + 1)
        ]
        for member in self.members:
            (member.folder / "data").mkdir(parents=True, exist_ok=True)
            (member.folder / "data" / "myid").write_text(f"{member.myid}\n", encoding="ascii")
            (member.folder / CONFIG).write_text(member_config(member, self.members, self.tick_ms), encoding="utf-8")
        return self.members

    def wait_until_serving(self, members: Iterable[EnsembleMember] | None = None) -> None:
        """Wait until ``members`` (default: all) serve, as leader or follower, with one leader among them."""
        waiting = list(self.members if members is None else members)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            exited = [member for member in waiting if member.process is not None and member.process.poll() is not None]
            if exited:
                raise ZooKeeperError(f"{exited[0].name} exited; see {exited[0].folder / 'zookeeper.log'}")
            if all(member.mode() in ("leader", "follower") for member in waiting):
                return
            time.sleep(0.1)
        modes = ", ".join(f"{member.name} {member.mode()}" for member in waiting)
        raise ZooKeeperError(f"the ZooKeeper ensemble did not serve within {self.start_timeout} s ({modes})")


def member_config(member: EnsembleMember, members: list[EnsembleMember], tick_ms: int) -> str:
    """``zoo.cfg`` of ``member``: paths relative to its folder, its client port on its host only (with a TLS
    client port: that one on its host, the plain one on 127.0.0.1 for local tools, the quorum's links TLS)."""
    plain_host = member.host if member.secure_port is None else "127.0.0.1"
    lines = [
        f"tickTime={tick_ms}",
        "initLimit=20",  # ticks a follower has to connect and sync with the leader
        "syncLimit=4",  # ticks a follower may lag before the leader drops it
        "dataDir=data",
        f"clientPort={member.client_port}",
        f"clientPortAddress={plain_host}",
        "admin.enableServer=false",
        "4lw.commands.whitelist=ruok,srvr,stat,mntr",
        CONNECTION_LIMIT,
        f"minSessionTimeout={2 * tick_ms}",
        "maxSessionTimeout=60000",
        "reconfigEnabled=false",
        "standaloneEnabled=false",
    ]
    lines += [f"server.{peer.myid}={peer.host}:{peer.peer_port}:{peer.election_port}" for peer in members]
    if member.secure_port is not None:
        lines += tls_config(member)
    return "\n".join(lines) + "\n"


def tls_config(member: EnsembleMember) -> list[str]:
    """The TLS lines of a member's ``zoo.cfg``: its TLS client port, client certificates of the cluster CA
    required, and TLS between the members (files in ``tls/`` of its folder, see
    :func:`~streamlet.backends.cluster.local.certificates.zookeeper_files`). The certificates name processes,
    not addresses: the cluster CA's signature is the check, not the host name."""
    lines = [
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
        f"secureClientPort={member.secure_port}",
        f"secureClientPortAddress={member.host}",
        "sslQuorum=true",
    ]
    for prefix in ("ssl", "ssl.quorum"):
        lines += [
            f"{prefix}.keyStore.location={TLS_KEYSTORE}",
            f"{prefix}.keyStore.type=PEM",
            f"{prefix}.trustStore.location={TLS_TRUSTSTORE}",
            f"{prefix}.trustStore.type=PEM",
            f"{prefix}.clientAuth=need",
            f"{prefix}.hostnameVerification=false",
        ]  # no ssl.protocol=TLSv1.3: ZooKeeper 3.8.0 on Debian's Netty 4.1.48 then drops every handshake
    return lines
