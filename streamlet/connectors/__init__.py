"""Connectors to outside systems (files, Kafka)."""
