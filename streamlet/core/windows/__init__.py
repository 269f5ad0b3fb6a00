"""Window logic (count, processing time, event time, hybrid) and folding, behind the specs in ``model``."""
