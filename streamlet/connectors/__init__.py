"""Connectors to outside systems (files, Spark, Kafka)."""
