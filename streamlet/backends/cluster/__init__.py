"""The ZooKeeper-coordinated cluster backend: a local ZooKeeper launcher, the coordinator, masters and workers."""
