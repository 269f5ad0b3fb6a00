"""The leader: job lifecycle, placement, backup placement, the adaptation loop and the planning of live
changes. It talks to the workers and clients only through the coordination tree (``tree``)."""
