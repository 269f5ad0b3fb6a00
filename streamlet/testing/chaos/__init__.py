"""Deterministic simulation of the whole cluster under seeded faults, checked for exact answers."""
