"""Checkpoint framing (encode/decode, format versions) and the in-memory and directory stores."""

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
from streamlet.core.model.encoding import packb
from streamlet.core.state.store import FORMAT_VERSION, decode, encode

HEADER = 22  # magic (8), format version (2), crc32 (4), body length (8)
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


def framed(body: bytes, version: int = 2) -> bytes:
    """``body`` in a frame of format ``version`` (2 and later), with a correct CRC."""
    crc = zlib.crc32(body, zlib.crc32(struct.pack(">H", version)))
    return struct.pack(">8sHIQ", b"STLTCKPT", version, crc, len(body)) + body


def legacy(document: dict[str, Any]) -> bytes:
    """``document`` as format 1 wrote it: magic STLTCKP1, no version field, plain msgpack (tuples as arrays)."""
    body = msgpack.packb(document, use_bin_type=True)
    return struct.pack(">8sIQ", b"STLTCKP1", zlib.crc32(body), len(body)) + body


def test_encode_decode_round_trip() -> None:
    """decode(encode(d)) == d, bytes and nested lists included."""
    assert decode(encode(DOCUMENT)) == DOCUMENT


def test_encoding_is_a_framed_msgpack_body() -> None:
    """The frame is magic, format version 2, CRC-32 of version and body, body length, then the body.

    A document without tuples is plain msgpack.
    """
    data = encode(DOCUMENT)
    body = msgpack.packb(DOCUMENT, use_bin_type=True)
    crc = zlib.crc32(b"\x00\x02" + body)
    assert FORMAT_VERSION == 2
    assert data == struct.pack(">8sHIQ", b"STLTCKPT", 2, crc, len(body)) + body


def test_a_document_with_tuples_round_trips_with_its_types() -> None:
    """Tuples stay tuples (nested, and as keys), lists stay lists, int-keyed dicts keep their keys."""
    document = {**DOCUMENT, "window": [("k", (1, 2.5)), [("a",)], {(1, "x"): {3: (None, b"z")}}]}
    decoded = decode(encode(document))
    assert decoded == document
    assert decoded["window"][0] == ("k", (1, 2.5))
    assert type(decoded["window"][0]) is tuple
    assert type(decoded["window"][0][1]) is tuple
    assert type(decoded["window"][1]) is list
    assert type(decoded["window"][1][0]) is tuple
    assert list(decoded["window"][2]) == [(1, "x")]
    assert decoded["window"][2][1, "x"] == {3: (None, b"z")}
    assert type(decoded["window"][2][1, "x"][3]) is tuple
    assert encode(document)[HEADER:] == packb(document)


def test_decode_rejects_a_truncated_header() -> None:
    """Fewer bytes than a header: the message gives the length."""
    with invalid("truncated header (21 bytes)"):
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
    with invalid("not a checkpoint document"):
        decode(framed(msgpack.packb([1, 2])))


def test_decode_rejects_a_flipped_version_as_corrupt() -> None:
    """The CRC covers the version: a flipped bit there is a checksum mismatch (skipped), not another format."""
    data = bytearray(encode(DOCUMENT))
    data[9] ^= 0x01  # the low byte of the version: 2 -> 3
    with invalid("checksum mismatch"):
        decode(bytes(data))


def test_decode_rejects_an_unknown_extension_type() -> None:
    """An intact frame whose body holds an extension type other than a tuple is refused, never returned."""
    with invalid("msgpack extension type 9 is not allowed"):
        decode(framed(msgpack.packb({"epoch": msgpack.ExtType(9, b"")})))


def test_decode_refuses_an_intact_format_1_checkpoint_naming_file_and_version() -> None:
    """Format 1 (tuples stored as lists) is not guessed at: a CheckpointError names the source and the version."""
    with pytest.raises(sl.CheckpointError) as caught:
        decode(legacy(DOCUMENT), "ckpt/checkpoint-0000000003.msgpack")
    assert str(caught.value) == (
        "ckpt/checkpoint-0000000003.msgpack is a checkpoint of format version 1, from a streamlet that stored "
        "tuples as lists; this streamlet reads format version 2 only and will not guess which lists were tuples: "
        "finish the job with the streamlet that wrote it, or move the checkpoint directory away to start afresh"
    )


def test_decode_refuses_an_intact_checkpoint_of_a_newer_format() -> None:
    """An intact frame of format 3 is refused with the version, not read as if it were 2."""
    with pytest.raises(sl.CheckpointError) as caught:
        decode(framed(packb(DOCUMENT), version=3), "checkpoint-0000000004.msgpack")
    assert str(caught.value) == (
        "checkpoint-0000000004.msgpack is a checkpoint of format version 3; this streamlet reads format version 2 only"
    )


def test_decode_treats_a_torn_format_1_checkpoint_as_torn() -> None:
    """A format 1 file cut short is corrupt like any other (skipped by the stores), not a format error."""
    data = legacy(DOCUMENT)
    length = len(data) - 20
    with invalid(f"torn: {length - 1} of {length} bytes"):
        decode(data[:-1])


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


def test_directory_store_refuses_a_format_1_checkpoint_naming_the_file(tmp_path: Path) -> None:
    """latest() raises for an intact format 1 newest file rather than skip it (that would redo or lose work)."""
    store = sl.DirectoryCheckpointStore(tmp_path)
    store.save(1, encode(document(1)))
    store.path(2).write_bytes(legacy(document(2)))
    with pytest.raises(
        sl.CheckpointError, match=f"^{re.escape(str(store.path(2)))} is a checkpoint of format version 1,"
    ):
        store.latest()


def test_directory_store_skips_a_torn_format_1_file(tmp_path: Path) -> None:
    """A format 1 file that is torn is skipped like any torn file, for the intact checkpoint before it."""
    store = sl.DirectoryCheckpointStore(tmp_path)
    store.save(1, encode(document(1)))
    store.path(2).write_bytes(legacy(document(2))[:-5])
    assert store.latest() == (1, document(1))


def test_directory_store_without_checkpoints_has_none(tmp_path: Path) -> None:
    """An empty (or newly created) directory has no latest checkpoint."""
    store = sl.DirectoryCheckpointStore(tmp_path / "new" / "dir")
    assert (store.epochs(), store.latest()) == ([], None)
