"""A master or worker reads the cluster secret from a file only its owner can read, and keeps it out of its
environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamlet.backends.cluster.local.local_cluster import SECRET_ENV, process_secret, read_secret_file
from streamlet.errors import ClusterError


def secret_file(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_raw_and_hex_secret_files_are_read(tmp_path: Path) -> None:
    """The raw bytes cluster up writes, or hex text with a newline."""
    raw = os.urandom(32)
    assert read_secret_file(secret_file(tmp_path / "raw", raw)) == raw
    assert read_secret_file(secret_file(tmp_path / "hex", raw.hex().encode() + b"\n")) == raw


def test_a_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    """Mode 0644 is refused with the mode and the fix."""
    path = secret_file(tmp_path / "open", b"x" * 32, 0o644)
    with pytest.raises(
        ClusterError, match=rf"^the secret file {path} is open to others \(mode 644\): chmod 600 {path}$"
    ):
        read_secret_file(path)


def test_the_environment_loses_the_secret_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STREAMLET_SECRET is taken out of os.environ (children and job code inherit nothing), file or not."""
    monkeypatch.setenv(SECRET_ENV, "ab" * 32)
    assert process_secret(None) == bytes.fromhex("ab" * 32)
    assert SECRET_ENV not in os.environ
    monkeypatch.setenv(SECRET_ENV, "cd" * 32)
    assert process_secret(secret_file(tmp_path / "s", b"ef" * 32)) == bytes.fromhex("ef" * 32)
    assert SECRET_ENV not in os.environ


def test_no_secret_at_all_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a file nor the variable: a clear error."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(ClusterError, match=r"^give the cluster secret: --secret-file FILE \(mode 0600\)"):
        process_secret(None)
