"""A cluster on this machine: the master and worker processes, ``cluster up``/``down``, the local
ZooKeeper server and child processes. It starts the roles, so it may import them."""
