"""A worker: the parts of jobs it runs, joining running attempts, handing off segments, replicating
checkpoint parts, its share of checkpoints and loop termination, and metering its load. It talks to the
leader and the clients only through the coordination tree (``tree``)."""
