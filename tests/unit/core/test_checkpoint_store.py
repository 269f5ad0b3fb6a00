"""Checkpoint framing (encode/decode) and the in-memory and directory stores."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from structlog.testing import capture_logs

import streamlet as sl
from streamlet.core.state.store import decode, encode

HEADER = 20  # magic (8), crc32 (4), body length (8)
DOCUMENT: dict[str, Any] = {
    "epoch": 3,
    "job": "counts",
    "finished": False,
    "sources": {"in": [17, None]},
    "tasks": {"count": [{"state": [["a", 1], [["user", 1], 2.5]], "window": None, "finished": False}]},
    "blob": b"\x00\xff",
}


def document(epoch: int) -> dict[str, Any]:
    """A small checkpoint document for ``epoch``."""
    return {**DOCUMENT, "epoch": epoch}


def invalid(message: str) -> pytest.RaisesExc[ValueError]:
    """Expect a ValueError whose message is exactly ``message``."""
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


def test_encode_decode_round_trip() -> None:
    """decode(encode(d)) == d, bytes and nested lists included."""
    assert decode(encode(DOCUMENT)) == DOCUMENT


def test_encoding_is_a_framed_msgpack_body() -> None:
    """The frame is magic, CRC-32 and length of the msgpack body, then the body."""
    data = encode(DOCUMENT)
    body = msgpack.packb(DOCUMENT, use_bin_type=True)
    assert data == struct.pack(">8sIQ", b"STLTCKP1", zlib.crc32(body), len(body)) + body


def test_decode_rejects_a_truncated_header() -> None:
    """Fewer bytes than a header: the message gives the length."""
    with invalid("truncated header (19 bytes)"):
        decode(encode(DOCUMENT)[: HEADER - 1])


def test_decode_rejects_wrong_magic() -> None:
    """Bytes that do not start with the streamlet magic are not a checkpoint."""
    with invalid("not a streamlet checkpoint"):
        decode(b"NOTSTLT!" + encode(DOCUMENT)[8:])


def test_decode_rejects_a_torn_body() -> None:
    """A body shorter than the header says is torn; the message gives both lengths."""
    data = encode(DOCUMENT)
    length = len(data) - HEADER
    with invalid(f"torn: {length - 3} of {length} bytes"):
        decode(data[:-3])


def test_decode_rejects_a_flipped_byte() -> None:
    """One flipped bit in the body fails the checksum."""
    data = bytearray(encode(DOCUMENT))
    data[HEADER + 5] ^= 0x01
    with invalid("checksum mismatch"):
        decode(bytes(data))


def test_decode_rejects_a_body_that_is_not_a_document() -> None:
    """An intact frame around a msgpack list is not a checkpoint document."""
    body = msgpack.packb([1, 2])
    with invalid("not a checkpoint document"):
        decode(struct.pack(">8sIQ", b"STLTCKP1", zlib.crc32(body), len(body)) + body)


def test_in_memory_store_returns_the_newest_checkpoint() -> None:
    """latest() is the highest epoch, decoded."""
    store = sl.InMemoryCheckpointStore()
    assert store.latest() is None
    for epoch in (1, 2):
        store.save(epoch, encode(document(epoch)))
    assert (store.epochs(), store.latest()) == ([1, 2], (2, document(2)))


def test_in_memory_store_skips_a_corrupt_newest_checkpoint() -> None:
    """A torn newest checkpoint is passed over for the previous one, with a warning."""
    store = sl.InMemoryCheckpointStore()
    store.save(1, encode(document(1)))
    store.save(2, encode(document(2)))
    store.corrupt(2, encode(document(2))[:-1])
    with capture_logs() as logs:
        assert store.latest() == (1, document(1))
    assert store.epochs() == [1, 2]
    length = len(encode(document(2))) - HEADER
    assert logs == [
        {
            "event": "skipping unreadable checkpoint",
            "epoch": 2,
            "reason": f"torn: {length - 1} of {length} bytes",
            "log_level": "warning",
        }
    ]


def test_in_memory_store_with_only_corrupt_checkpoints_has_none() -> None:
    """When nothing reads back intact, latest() is None."""
    store = sl.InMemoryCheckpointStore()
    store.save(1, encode(document(1)))
    store.corrupt(1, b"garbage")
    assert store.latest() is None


def files(directory: Path) -> list[str]:
    """Names in ``directory``, sorted."""
    return sorted(path.name for path in directory.iterdir())


def test_directory_store_writes_one_file_per_epoch(tmp_path: Path) -> None:
    """Checkpoint 7 is checkpoint-0000000007.msgpack, holding the encoded document."""
    store = sl.DirectoryCheckpointStore(tmp_path / "ckpt")
    store.save(7, encode(document(7)))
    assert files(tmp_path / "ckpt") == ["checkpoint-0000000007.msgpack"]
    assert (tmp_path / "ckpt" / "checkpoint-0000000007.msgpack").read_bytes() == encode(document(7))


def test_directory_store_keeps_only_the_newest(tmp_path: Path) -> None:
    """keep=2: after five saves only epochs 4 and 5 remain, and no .tmp file is left."""
    store = sl.DirectoryCheckpointStore(tmp_path, keep=2)
    for epoch in range(1, 6):
        store.save(epoch, encode(document(epoch)))
    assert files(tmp_path) == ["checkpoint-0000000004.msgpack", "checkpoint-0000000005.msgpack"]
    assert (store.epochs(), store.latest()) == ([4, 5], (5, document(5)))


def test_directory_store_skips_a_truncated_newest_file(tmp_path: Path) -> None:
    """A newest file cut short (a crash mid-write) is passed over for the previous one."""
    store = sl.DirectoryCheckpointStore(tmp_path)
    store.save(1, encode(document(1)))
    store.save(2, encode(document(2)))
    newest = store.path(2)
    newest.write_bytes(newest.read_bytes()[:30])
    assert store.latest() == (1, document(1))


def test_directory_store_skips_a_garbage_file(tmp_path: Path) -> None:
    """A file with a checkpoint name but no checkpoint inside is passed over."""
    store = sl.DirectoryCheckpointStore(tmp_path)
    store.save(1, encode(document(1)))
    (tmp_path / "checkpoint-0000000009.msgpack").write_bytes(b"\x00garbage")
    assert (store.epochs(), store.latest()) == ([1, 9], (1, document(1)))


def test_directory_store_ignores_unrelated_files(tmp_path: Path) -> None:
    """Other names, non-numeric epochs and temporary files are not checkpoints."""
    for name in ("notes.txt", "checkpoint-latest.msgpack", "checkpoint-0000000008.tmp", "other-0000000009.msgpack"):
        (tmp_path / name).write_bytes(encode(document(99)))
    store = sl.DirectoryCheckpointStore(tmp_path)
    store.save(3, encode(document(3)))
    assert (store.epochs(), store.latest()) == ([3], (3, document(3)))


def test_directory_store_without_checkpoints_has_none(tmp_path: Path) -> None:
    """An empty (or newly created) directory has no latest checkpoint."""
    store = sl.DirectoryCheckpointStore(tmp_path / "new" / "dir")
    assert (store.epochs(), store.latest()) == ([], None)
