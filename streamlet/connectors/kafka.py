"""Kafka in and out (``pip install 'streamlet[kafka]'``, through aiokafka).

- :class:`KafkaSource`: partitions spread over the source's instances by hand
  (no group rebalancing); offsets in checkpoints, committed to the group only
  after a checkpoint completes; undecodable records dead-lettered or fatal.
- :class:`KafkaSink`: an idempotent producer, or transactional and exactly-once
  with checkpoints.

aiokafka is imported when a connector is opened, not with this module; when
it is missing, opening one raises :class:`KafkaError` naming the extra.
"""

from __future__ import annotations

from streamlet.connectors.kafka_common import decode_utf8, encode
from streamlet.connectors.kafka_sink import KafkaSink
from streamlet.connectors.kafka_source import KafkaSource
from streamlet.errors import KafkaError

__all__ = ("KafkaError", "KafkaSink", "KafkaSource", "decode_utf8", "encode")
