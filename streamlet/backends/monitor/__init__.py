"""Seeing the system: the dashboard (``server``), Prometheus metrics (``metrics``) and the views both show."""
