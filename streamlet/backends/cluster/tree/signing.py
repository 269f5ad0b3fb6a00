"""Signed job specs: a worker runs only what a holder of the cluster secret submitted.

A spec names code by reference (``module:name`` or ``file.py:name``), and a
worker imports that code, so the spec is a command. ``submit`` signs it with
HMAC-SHA256 under the cluster secret and records the SHA-256 of the module
file it names; a worker checks the signature *before importing anything*,
then checks that its own copy of the module has the same digest. Either
failing refuses the job with a :class:`SpecError` that says which. The
folder a savepoint asks the workers to write their parts into is signed the
same way, with the job and epoch (:func:`sign_export`, :func:`export_folder`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.tree.paths import JobSpec
from streamlet.errors import SpecError, StreamletError
from streamlet.job_code import read_source, source_file


def _message(spec: JobSpec) -> bytes:
    unsigned = {key: value for key, value in spec.items() if key != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()


def sign(spec: JobSpec, secret: bytes) -> JobSpec:
    """``spec`` with its module's digest and an HMAC signature over everything else."""
    stamped: JobSpec = {**spec, "module_sha256": module_digest(spec["target"])}
    stamped["signature"] = hmac.new(secret, _message(stamped), hashlib.sha256).hexdigest()
    return stamped


def verify(job: str, spec: dict[str, Any], secret: bytes) -> JobSpec:
    """Check the signature (importing nothing), then the module digest; returns the spec."""
    checked: JobSpec = spec  # type: ignore[assignment]  # shape checked below, before anything runs
    signature = str(spec.get("signature", ""))
    expected = hmac.new(secret, _message(checked), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(signature, expected):
        raise SpecError(f"job '{job}': its spec is not signed with this cluster's secret; refusing to run it")
    digest = module_digest(checked["target"])
    if digest != checked.get("module_sha256"):
        raise SpecError(
            f"job '{job}': {module_file(checked['target'])} here differs from the module that was submitted "
            f"(sha256 {digest[:12]}, submitted {str(checked.get('module_sha256'))[:12]}); refusing to run it"
        )
    return checked


def module_file(target: str) -> Path:
    """The file a target's code lives in (a package's parents are imported to find it)."""
    try:
        return source_file(target.partition(":")[0])
    except StreamletError as exc:
        raise SpecError(str(exc)) from exc


def module_digest(target: str) -> str:
    """SHA-256 of the module file ``target`` names."""
    path = module_file(target)
    try:
        return hashlib.sha256(read_source(path)).hexdigest()
    except StreamletError as exc:
        raise SpecError(str(exc)) from exc


def _export_message(job: str, epoch: int, folder: str) -> bytes:
    return json.dumps(["savepoint export", job, epoch, folder], separators=(",", ":")).encode()


def sign_export(secret: bytes, job: str, epoch: int, folder: str) -> str:
    """The signature a savepoint's trigger carries for the folder the workers write their parts into."""
    return hmac.new(secret, _export_message(job, epoch, folder), hashlib.sha256).hexdigest()


def export_folder(secret: bytes, job: str, epoch: int, trigger: dict[str, Any]) -> Path:
    """The folder a trigger asks this worker to write its part of ``epoch`` into, once checked: signed with
    the cluster secret for this job and epoch, absolute, named ``<savepoint file>.parts`` as the client makes
    it, and no symbolic link (a part lands exactly in the folder the client named). Else a
    :class:`SpecError` saying why."""
    folder = str(trigger.get("export", ""))
    signature = str(trigger.get("export_signature", ""))
    if not hmac.compare_digest(signature, sign_export(secret, job, epoch, folder)):
        raise SpecError(f"job '{job}': the savepoint folder {folder!r} of epoch {epoch} is not signed with this "
                        "cluster's secret; writing nothing there")  # fmt: skip
    path = Path(folder)
    if not path.is_absolute() or not path.name.endswith(".parts") or path.resolve() != path:
        raise SpecError(f"job '{job}': the savepoint folder {folder!r} is not an absolute '<file>.parts' folder "
                        "without symbolic links; writing nothing there")  # fmt: skip
    return path
