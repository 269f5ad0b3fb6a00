"""Running a topology in one event loop: the clock, channels, outputs and routing, cycles, the instances,
the physical plan and the job. The top of ``core``: it uses every layer below it."""
