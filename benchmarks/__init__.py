"""Benchmarks: ``python -m benchmarks NAME --json``. Never part of the test run."""
