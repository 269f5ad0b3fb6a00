"""Job code run from the very bytes that were signed, each version a module of its own.

A job names its code by reference (``path/to/job.py`` or ``package.module``).
Importing it the usual way goes wrong in long-lived processes and in odd
names: ``importlib.import_module`` hands back the copy already in
``sys.modules`` (an edited and resubmitted job would run its old code), and a
file registered under its stem shadows a standard module (a job file called
``random.py`` breaks every ``import random`` after it).

So a job module is read once, its SHA-256 checked against the digest the
spec signs (when there is one), compiled from those bytes and executed as a
fresh module registered under a private name made of its stem, digest and path
(``streamlet_job_<stem>_<digest[:16]>_<path hash>``): dataclasses and typing, which look
a class's module up in ``sys.modules``, work; nothing is shadowed; another
version of the file is another module. Its ``__file__`` is the file's path;
its code objects name ``<path> (sha256 <digest[:12]>)``, and the signed
source is in ``linecache`` under that name, so a traceback shows the lines
that ran, not what the file holds now. :func:`release` forgets a version.

What this covers is the one module the reference names. Modules it imports
itself (``import helpers`` from its own folder) go through Python's import
system as always: they are neither signed nor reloaded, and a long-lived
worker keeps the first version it imported. Put code that changes with the
job in the job file, or make it a package installed on every host.

Targets inside the ``streamlet`` package are the library's own code and are
imported as usual (``streamlet.backends.cluster.simulated.targets`` keeps a
registry that must be the one in ``sys.modules``).

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> (folder / "random.py").write_text("import random\\nPICK = random.Random(1).randint(1, 6)\\n")
    53
    >>> module = load_module(str(folder / "random.py"))
    >>> module.PICK, module.__name__.startswith("streamlet_job_random_"), sys.modules["random"] is not module
    (2, True, True)
    >>> release(module)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import linecache
import re
import sys
import types
from pathlib import Path

from streamlet.errors import SpecError, StreamletError

PREFIX = "streamlet_job_"
"""The start of every job module's name in ``sys.modules``."""


def load_module(location: str, digest: str | None = None) -> types.ModuleType:
    """The module ``location`` names (a ``.py`` path or a dotted module name), run from its file's bytes.

    With ``digest`` (the spec's signed SHA-256) the bytes read must have it,
    else :class:`~streamlet.errors.SpecError`: the file changed since it was
    signed. The same bytes loaded twice give the same module.
    """
    if location == "streamlet" or location.startswith("streamlet."):
        return _import(location)  # the library's own code, not job code
    path, package = _source_of(location)
    data = read_source(path)
    found = hashlib.sha256(data).hexdigest()
    if digest is not None and found != digest:
        raise SpecError(
            f"{path} differs from the module that was submitted (sha256 {found[:12]}, submitted {digest[:12]}); "
            "refusing to run it"
        )
    name = module_name(path, found)
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    return _execute(name, path, data, package, found)


def module_name(path: Path, digest: str) -> str:
    """The private name the version ``digest`` of ``path`` is registered under."""
    stem = re.sub(r"\W", "_", path.stem if path.name != "__init__.py" else path.parent.name)
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]  # the same bytes elsewhere: another module
    return f"{PREFIX}{stem}_{digest[:16]}_{where}"


def code_name(path: Path, digest: str) -> str:
    """The file name its code objects and tracebacks give: the path and the version that ran."""
    return f"{path} (sha256 {digest[:12]})"


def read_source(path: Path) -> bytes:
    """The bytes of a job's file, or a :class:`~streamlet.errors.StreamletError` saying why not."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise StreamletError(f"no such file: {path}") from None
    except OSError as exc:
        raise StreamletError(f"cannot read {path}: {exc.strerror}") from exc


def source_file(location: str) -> Path:
    """The file whose bytes a reference's code is: the path itself, or where the module would be imported from."""
    return _source_of(location)[0]


def release(module: types.ModuleType) -> None:
    """Forget a job module this process loaded (its objects still in use keep working)."""
    name = module.__name__
    if not name.startswith(PREFIX):
        return
    sys.modules.pop(name, None)
    code = getattr(module, "__streamlet_code_name__", None)
    if isinstance(code, str):
        linecache.cache.pop(code, None)


def forget(target: str, digest: str | None) -> None:
    """Forget the version ``digest`` of the module ``target`` names, if this process loaded it (a job ended)."""
    location = target.partition(":")[0]
    if digest is None or location == "streamlet" or location.startswith("streamlet."):
        return
    try:
        name = module_name(source_file(location), digest)
    except StreamletError:
        return  # the file is gone: nothing of it can be loaded here either
    module = sys.modules.get(name)
    if module is not None:
        release(module)


def _source_of(location: str) -> tuple[Path, str]:
    """The file of ``location`` and the package its relative imports resolve in."""
    if location.endswith(".py"):
        return Path(location), ""
    try:
        spec = importlib.util.find_spec(location)
    except (ImportError, ValueError) as exc:
        raise StreamletError(f"cannot import {location}: {exc}") from exc
    if spec is None:
        raise StreamletError(f"cannot import {location}: No module named {location!r}")
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise StreamletError(f"cannot load {location}: job code is a Python source file, {location} has none")
    package = location if spec.submodule_search_locations is not None else location.rpartition(".")[0]
    return Path(spec.origin), package


def _execute(name: str, path: Path, data: bytes, package: str, digest: str) -> types.ModuleType:
    filename = code_name(path, digest)
    try:
        code = compile(data, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise StreamletError(f"cannot load {path}: {exc.msg} (line {exc.lineno})") from exc
    module = types.ModuleType(name)
    module.__file__ = str(path)
    module.__package__ = package
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=str(path))
    module.__streamlet_code_name__ = filename  # type: ignore[attr-defined]  # for release()
    if path.name == "__init__.py":
        module.__path__ = [str(path.parent)]
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    linecache.cache[filename] = (len(data), None, lines, filename)  # mtime None: never checked against disk
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        release(module)
        raise
    return module


def _import(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise StreamletError(f"cannot import {name}: {exc}") from exc
