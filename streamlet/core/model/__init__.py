"""What the user writes, as plain data: records, tasks and operators, sources, sinks, partitioning, the
topology and its validation. Imports nothing else from ``core``: the other layers build on it."""
