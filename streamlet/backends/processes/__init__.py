"""All the cores of one machine: ``streamlet.run(topology, processes=N)`` runs a job in N worker processes.

No ZooKeeper and no cluster: the calling process forks N worker processes
(``parent``), each runs its share of the instances (``placement``: a task
with parallelism N gets one instance per process) as a cluster worker runs
its part of a job (``child``): in-memory channels between instances in the
same process, authenticated TCP on 127.0.0.1 between processes (the data
plane of ``streamlet.transport``, with a secret drawn for the run). The
parent runs no instance: it follows the processes over a socket pair each
(``wire``: msgpack, never pickle), gathers their results into one
``JobResult`` (``results``) and raises what the job would raise in one
process (``failures``). It also leads what needs every process to agree:
when a loop has ended (``loops``) and when a checkpoint is complete
(``checkpoints``: it saves the same document a job in one process saves).
The topology is never sent anywhere: a forked child has it already.
"""

from streamlet.backends.processes.parent import run_in_processes

__all__ = ("run_in_processes",)
