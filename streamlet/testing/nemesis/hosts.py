"""Test hosts on one machine: network namespaces on a bridge, addresses from 198.18.0.0/15, silent cuts.

A :class:`HostNetwork` (one *run*) makes a bridge ``slb<run>`` in the root
namespace with the run's /24 of 198.18.0.0/15 (the range set aside for
network tests): ``198.18.N.1`` on the bridge is this process (the test, its
``submit``, its ZooKeeper reads), and each :meth:`HostNetwork.add_host` is a
namespace ``sl-<run>-<name>`` with a veth pair to the bridge
(``sl<run>v<n>`` outside, ``eth0`` inside) and the next address. So
``--host``/``--zk`` are real, distinct addresses, and a link between two
hosts can be cut.

A cut drops packets **silently**, as a pulled cable or a firewall does (this
kernel has no ``tc netem``): each host's namespace has an nftables table
whose set ``cut`` holds the addresses it may not talk to, dropped on input and
output. A sender sees no reset and no ICMP, only silence, so every timeout on
the path is the one that decides. :meth:`HostNetwork.cut` and
:meth:`HostNetwork.heal` add and remove addresses; nothing is refused.

Interface names carry the run id and stay within Linux's 15 characters. A
run records its owner's PID under ``/run/streamlet-hosts/``; a new run first
removes what a dead run left (its namespaces, their processes, by PID, and
its bridge), and :meth:`HostNetwork.remove` removes everything at the end,
also when the run was aborted. Root and ``ip``/``nft`` are needed:
:func:`unavailable` says why they are not there.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from streamlet.backends.cluster.local.local_cluster import alive
from streamlet.errors import HostsUnavailable

REGISTRY = Path("/run/streamlet-hosts")
NETWORK = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544: benchmarking and network tests
SUBNETS = 512  # /24s in the /15
PREFIX = "sl-"  # namespaces: sl-<run>-<host>
TABLE = "streamlet"  # each namespace's nftables table, with the set 'cut'
RULESET = f"""
table inet {TABLE} {{
    set cut {{ type ipv4_addr; }}
    chain input {{ type filter hook input priority 0; policy accept; ip saddr @cut drop; }}
    chain output {{ type filter hook output priority 0; policy accept; ip daddr @cut drop; }}
}}
"""


def unavailable() -> str | None:
    """Why test hosts cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add): run as root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian package {package})"
    return None


@dataclass(frozen=True)
class Host:
    """One test host: its namespace and address."""

    name: str
    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec`` execs it: the PID is the program's)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass
class HostNetwork:
    """A bridge, its /24 and the hosts on it; :meth:`cut`/:meth:`heal` between them. Use as a context manager
    (or :meth:`make` then :meth:`remove`)."""

    run: str = field(default_factory=lambda: secrets.token_hex(3)[:5])
    subnet: int = -1
    hosts: dict[str, Host] = field(default_factory=dict)
    cuts: dict[frozenset[str], tuple[str, str]] = field(default_factory=dict)  # pair -> as it was cut

    @property
    def bridge(self) -> str:
        return f"slb{self.run}"

    @property
    def here(self) -> str:
        """This process's address on the bridge: what the hosts see the test as."""
        return self._address(1)

    def __enter__(self) -> HostNetwork:
        self.make()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def make(self) -> None:
        """Clear what dead runs left, take a free /24, make the bridge."""
        reason = unavailable()
        if reason is not None:
            raise HostsUnavailable(reason)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        with _registry_lock():
            clear_dead_runs()
            taken = {int(json.loads(path.read_text())["subnet"]) for path in REGISTRY.glob("*.json")}
            self.subnet = next(n for n in range(SUBNETS) if n not in taken)
            (REGISTRY / f"{self.run}.json").write_text(json.dumps({"pid": os.getpid(), "subnet": self.subnet}))
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.here}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        """A namespace on the bridge with the next address, its loopback up and its (empty) cut set."""
        number = len(self.hosts)
        host = Host(name, f"{PREFIX}{self.run}-{name}", self._address(number + 2))
        outside = f"sl{self.run}v{number}"
        _ip("netns", "add", host.namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        _run(host.command(["nft", "-f", "-"]), RULESET)
        self.hosts[name] = host
        return host

    def cut(self, one: str, other: str) -> None:
        """Drop everything between hosts ``one`` and ``other`` (either may be ``"here"``: this process)."""
        if frozenset((one, other)) not in self.cuts:
            self._set(one, other, "add")
            self.cuts[frozenset((one, other))] = (one, other)

    def heal(self, one: str, other: str) -> None:
        """Let ``one`` and ``other`` talk again."""
        cut = self.cuts.pop(frozenset((one, other)), None)
        if cut is not None:
            self._set(*cut, "delete")

    def heal_all(self) -> None:
        """Undo every cut."""
        for one, other in list(self.cuts.values()):
            self.heal(one, other)

    def _set(self, one: str, other: str, action: str) -> None:
        # Drop in a host's namespace, both ways: "here" (the root namespace) has no table of its own.
        inside, outside = (other, one) if one == "here" else (one, other)
        address = self.here if outside == "here" else self.hosts[outside].address
        _run(self.hosts[inside].command(["nft", action, "element", "inet", TABLE, "cut", f"{{ {address} }}"]))

    def remove(self) -> None:
        """Stop what still runs in the hosts (by PID), delete the namespaces (their veths go with them), the
        bridge and the run's record."""
        remove_run(self.run)

    def _address(self, index: int) -> str:
        return str(NETWORK.network_address + self.subnet * 256 + index)


def clear_dead_runs() -> list[str]:
    """Remove every run whose owner is gone (or that left namespaces without a record); the runs removed."""
    runs = {path.stem for path in REGISTRY.glob("*.json")} | {_run_of(name) for name in _namespaces()}
    dead = []
    for run in sorted(runs):
        record = REGISTRY / f"{run}.json"
        owner = int(json.loads(record.read_text())["pid"]) if record.exists() else None
        if owner is None or not alive(owner):
            remove_run(run)
            dead.append(run)
    return dead


def remove_run(run: str) -> None:
    """Everything of ``run``: processes in its namespaces (SIGKILL by PID), the namespaces, its bridge."""
    for namespace in _namespaces():
        if _run_of(namespace) == run:
            listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
            for pid in listed.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    subprocess.run(["ip", "link", "del", f"slb{run}"], capture_output=True)
    (REGISTRY / f"{run}.json").unlink(missing_ok=True)


def _namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    return [name for name in names if name.startswith(PREFIX)]


def _run_of(namespace: str) -> str:
    return namespace.removeprefix(PREFIX).split("-", 1)[0]


@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    with open(REGISTRY / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise HostsUnavailable(f"{' '.join(argv)} failed: {done.stderr.strip()}")
