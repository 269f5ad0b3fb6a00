"""Keyed state, checkpoints (the coordinator, its store, the durable write) and restoring a job from one."""
