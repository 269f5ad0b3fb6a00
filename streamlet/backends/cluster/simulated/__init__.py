"""The simulated cluster: the same roles on the in-memory store and an injected clock, in one process,
and the job targets its tests use."""
