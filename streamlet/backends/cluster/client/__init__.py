"""What a user runs against a cluster: submit, kill, rm, rescale, migrate, rebalance, savepoints, status
and top. It talks to the leader and the workers only through the coordination tree (``tree``)."""
