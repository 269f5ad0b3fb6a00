"""A streamlet cluster whose every process runs on a test host of its own (see :mod:`.hosts`).

ZooKeeper members (``zookeeper-1`` … on ports 2181/2888/3888 of their own
address, as on separate machines), masters and workers (``--host`` their
address, mutual TLS from the cluster's CA) each run in their host's network
namespace (each started with ``--config`` and a TOML file of its settings;
a worker listens on ``0.0.0.0`` and ``--advertise``s its address); this
process, on the bridge, submits and watches. The state
directory holds what ``streamlet cluster up`` would write (``cluster.json``
with every PID and command line, the secret, ``tls/``), so ``streamlet
submit``, ``cluster status`` and ``cluster down`` work on it too. Every
process is stopped by its PID; a killed one is started again from its recorded
command line.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.local import certificates, local_cluster
from streamlet.backends.cluster.local.local_cluster import ClusterState, streamlet_command
from streamlet.backends.cluster.local.zookeeper_ensemble import CONFIG, EnsembleMember, member_config
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.zk import four_letter_tls
from streamlet.errors import ZooKeeperError
from streamlet.testing.nemesis.hosts import HostNetwork
from streamlet.testing.zk_watch import ZkWatch
from streamlet.transport.tls import TlsSettings

CLIENT_PORT, PEER_PORT, ELECTION_PORT = 2181, 2888, 3888  # each member has an address of its own
SECURE_PORT = 2281  # the TLS client port on the member's address (the plain one serves its 127.0.0.1 only)
TICK_MS = 500


@dataclass
class HostCluster:
    """``zookeepers`` members, ``masters`` and ``workers``, each on its own host of ``network``."""

    network: HostNetwork
    state_dir: Path
    name: str = "nemesis"
    zookeepers: int = 3
    masters: int = 1
    workers: int = 2
    capacity: int = 3
    state: ClusterState | None = None
    members: list[EnsembleMember] = field(default_factory=list)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def zk(self) -> str:
        return ",".join(member.address for member in self.members)

    def secret(self) -> bytes:
        assert self.state is not None
        return self.state.secret()

    def start(self) -> None:
        """Hosts, the ensemble (serving), master-0 (leading), the other masters (candidates), workers (registered);
        stops what it started when one fails."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        secret_file = self.state_dir / "secret"
        secret_file.write_bytes(secrets.token_bytes(32))
        secret_file.chmod(0o600)
        self.state = ClusterState(name=self.name, zk="", secret_file=str(secret_file.resolve()))
        self.state.tls = self.state.zk_tls = True
        certificates.make_ca(self.tls_dir, self.name)
        try:
            self._start_ensemble()
            self._start_streamlet("master", "master-0")
            with self.watch() as zk:  # master-0 leads, the others stand by: a seed's faults meet the same roles
                zk.wait_for(paths.LEADER, lambda leader: bool(leader) and leader["name"] == "master-0", seconds=60)
            for index in range(1, self.masters):
                self._start_streamlet("master", f"master-{index}")
            for index in range(self.workers):
                self._start_streamlet("worker", f"worker-{index}")
            with self.watch() as zk:
                zk.wait_for_children(paths.WORKERS, lambda found: len(found) == self.workers, seconds=60)
                zk.wait_for_children(paths.CANDIDATES, lambda found: len(found) == self.masters, seconds=60)
        except BaseException:
            self.stop()
            raise

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / certificates.TLS_FOLDER

    def client_tls(self) -> TlsSettings:
        """This process's certificate (``client``, as ``streamlet submit`` here uses it)."""
        return certificates.process_tls(self.tls_dir, "client")

    def watch(self) -> ZkWatch:
        """A ZooKeeper session of this process's (on the bridge, over TLS) for waits and reads."""
        return ZkWatch(self.zk, self.name, self.secret(), tls=self.client_tls())

    def address(self, process: str) -> str:
        """The address of ``process``'s host."""
        return self.network.hosts[process].address

    def _start_ensemble(self) -> None:
        assert self.state is not None
        for myid in range(1, self.zookeepers + 1):
            host = self.network.add_host(f"zookeeper-{myid}")
            folder = self.state_dir / host.name
            member = EnsembleMember(myid, folder, CLIENT_PORT, PEER_PORT, ELECTION_PORT, host.address, SECURE_PORT)
            certificates.zookeeper_files(self.tls_dir, member.name, folder / "tls")
            self.members.append(member)
        self.state.zk = self.zk
        for member in self.members:
            (member.folder / "data").mkdir(parents=True, exist_ok=True)
            (member.folder / "data" / "myid").write_text(f"{member.myid}\n", encoding="ascii")
            (member.folder / CONFIG).write_text(member_config(member, self.members, TICK_MS), encoding="utf-8")
            self._launch(member.name, self.network.hosts[member.name].command(member.command()), member.folder)
        self._wait_until_serving()

    def _wait_until_serving(self) -> None:
        import time  # a ZooKeeper member has no event to wait on: its mode is asked for (four-letter word)

        deadline = time.monotonic() + 90
        tls = four_letter_tls(self.client_tls())
        while time.monotonic() < deadline:
            if all(member.mode(tls) in ("leader", "follower") for member in self.members):
                return
            time.sleep(0.2)
        modes = ", ".join(f"{member.name} {member.mode(tls)}" for member in self.members)
        raise ZooKeeperError(f"the ensemble on the test hosts did not serve within 90 s ({modes})")

    def _start_streamlet(self, role: str, process_id: str) -> None:
        assert self.state is not None
        host = self.network.add_host(process_id)
        settings: dict[str, Any] = {"zk": self.zk, "name": self.name, "id": process_id, "zk-tls": True}
        settings |= {"state-dir": str(self.state_dir.resolve()), "secret-file": self.state.secret_file}
        if role == "worker":  # listening on every address of its host, reached on the one it advertises
            settings |= {"host": "0.0.0.0", "advertise": host.address, "capacity": self.capacity}
        else:
            settings |= {"dashboard-port": 0}
        config = self.state_dir / f"{process_id}.toml"  # as a unit file would keep it short
        config.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items()))
        self._launch(process_id, host.command([*streamlet_command(), role, "--config", str(config)]), self.state_dir)

    def _launch(self, process_id: str, command: list[str], cwd: Path) -> None:
        assert self.state is not None
        environment = {key: value for key, value in os.environ.items() if key != local_cluster.SECRET_ENV}
        with open(self.state_dir / f"{process_id}.log", "ab") as log:
            process = subprocess.Popen(
                command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
                start_new_session=True,
            )  # fmt: skip
        self.processes[process_id] = process
        role = process_id.split("-", 1)[0]
        record: dict[str, Any] = {"role": role, "id": process_id, "pid": process.pid, "command": command}
        record.update({"cwd": str(cwd.resolve()), "host": self.network.hosts[process_id].address})
        self.state.processes = [p for p in self.state.processes if p["id"] != process_id] + [record]
        self.state.save(self.state_dir)

    # -- faults, by PID -----------------------------------------------------------------------------------

    def pid(self, process_id: str) -> int:
        return self.processes[process_id].pid

    def kill(self, process_id: str) -> None:
        """SIGKILL ``process_id`` and reap it."""
        process = self.processes[process_id]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def pause(self, process_id: str) -> None:
        """SIGSTOP: the process stops where it is (its sessions and links go quiet)."""
        self.processes[process_id].send_signal(signal.SIGSTOP)

    def resume(self, process_id: str) -> None:
        """SIGCONT."""
        self.processes[process_id].send_signal(signal.SIGCONT)

    def restart(self, process_id: str) -> None:
        """Start a killed process again from its recorded command line and folder."""
        assert self.state is not None
        record = next(p for p in self.state.processes if p["id"] == process_id)
        self._launch(process_id, list(record["command"]), Path(record["cwd"]))

    def stop(self) -> list[int]:
        """Stop every process by PID (workers and masters together first, ZooKeeper's members together last,
        each group given 15 s before SIGKILL); the PIDs still alive."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a paused one must run to end
        members = {process_id for process_id in self.processes if process_id.startswith("zookeeper")}
        for group in (set(self.processes) - members, members):
            running = [(process_id, self.processes[process_id]) for process_id in sorted(group)]
            running = [(process_id, process) for process_id, process in running if process.poll() is None]
            for _, process in running:
                process.terminate()
            deadline = time.monotonic() + 15
            for process_id, process in running:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    print(f"{process_id} did not stop within 15 s of SIGTERM: SIGKILL", file=sys.stderr)
                    process.kill()
                    process.wait(timeout=15)
        return [process.pid for process in self.processes.values() if process.poll() is None]
