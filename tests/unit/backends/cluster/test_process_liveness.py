"""``alive(pid)``, which ``cluster down`` waits on: a process that exited is gone, also when it is an orphan
that its new parent (init, here) has not reaped: a zombie answers signals, but nothing of it runs."""

from __future__ import annotations

import os
import signal
import subprocess

from streamlet.backends.cluster.local.local_cluster import alive
from tests.support.cluster import wait_for_exit


def test_an_exited_orphan_is_not_alive_even_unreaped() -> None:
    command = ["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"]
    orphan = int(subprocess.run(command, capture_output=True, text=True, check=True, timeout=10).stdout)
    try:  # its parent (the shell) is gone: it belongs to init now, not to us
        assert alive(orphan)
    finally:
        os.kill(orphan, signal.SIGKILL)  # stopped by its PID whatever happens
    assert wait_for_exit(orphan)
    assert not alive(orphan)
