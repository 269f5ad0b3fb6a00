"""The coordination tree, of no role: the store and its ZooKeeper client, every path and its node's shape,
and the reads and rules that the leader, the workers and the clients share. It imports no role."""
