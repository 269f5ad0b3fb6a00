"""An exception raised in a worker process, as plain data and back as the same exception in the parent.

The parent raises what the job would have raised in one process: the same
class (streamlet's errors, Python's built-in exceptions, or an exception
class of a module the parent has imported too, as a forked child's classes
are), the same message and the same attributes (a ``TaskError``'s task,
instance and key). The cause (the user's own exception) comes back the same
way, as ``__cause__``, with a note holding its traceback in the worker
process. Only classes that are already loaded are looked up, never imported;
a class that cannot be found or made again becomes a :class:`JobError`
naming it.

Example:
    >>> from streamlet.errors import TaskError
    >>> error = TaskError("task 'parse' instance 1 failed", task="parse", instance=1, key="k")
    >>> error.__cause__ = ValueError("bad value")
    >>> again = rebuilt(described(error), "worker process 1 of 2 (pid 4242)")
    >>> type(again).__name__, str(again), again.instance, repr(again.__cause__)
    ('TaskError', "task 'parse' instance 1 failed", 1, "ValueError('bad value')")
"""

from __future__ import annotations

import builtins
import inspect
import sys
import traceback
from typing import Any

from streamlet.core.model.encoding import packb
from streamlet.errors import JobError


def described(error: BaseException, *, with_traceback: bool = True) -> dict[str, Any]:
    """``error`` and its cause as plain data (for :func:`rebuilt`); the cause's traceback as text unless
    ``with_traceback`` is false (a dead letter's exception: there may be many)."""
    data = _data(error, with_traceback)
    if error.__cause__ is not None:
        data["cause"] = _data(error.__cause__, with_traceback)
    return data


def rebuilt(data: dict[str, Any], where: str) -> BaseException:
    """The exception ``data`` describes, its cause chained; ``where`` names the process it was raised in."""
    error = _made(data)
    cause = data.get("cause")
    if cause is not None:
        error.__cause__ = _made(cause)
        if cause["traceback"]:
            error.__cause__.add_note(f"raised in {where}:\n{cause['traceback'].rstrip()}")
    return error


def _data(error: BaseException, with_traceback: bool) -> dict[str, Any]:
    cls = type(error)
    return {
        "module": cls.__module__,
        "type": cls.__qualname__,
        "message": str(error),
        "args": [_plain(arg) for arg in error.args],
        "fields": {name: _plain(getattr(error, name)) for name in _fields(cls) if hasattr(error, name)},
        "traceback": "".join(traceback.format_exception(error)) if with_traceback else "",
    }


def _fields(cls: type[BaseException]) -> list[str]:
    """The attributes an exception class takes besides its message (``TaskError``: task, instance, key)."""
    if cls.__init__ is BaseException.__init__:
        return []
    try:
        parameters = list(inspect.signature(cls).parameters.values())[1:]
    except (TypeError, ValueError):  # a built-in without a signature
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [parameter.name for parameter in parameters if parameter.kind in kinds]


def _plain(value: Any) -> Any:
    """``value`` when it can be encoded, else its repr (a key of a type msgpack does not know)."""
    try:
        packb(value)
    except (TypeError, ValueError, OverflowError):
        return repr(value)
    return value


def _made(data: dict[str, Any]) -> BaseException:
    cls = _loaded_class(str(data["module"]), str(data["type"]))
    message = str(data["message"])
    if cls is not None:
        try:
            return cls(*data.get("args", [message]), **data.get("fields", {}))
        except Exception:  # noqa: BLE001 - a constructor that wants other arguments: said as a JobError
            pass
    return JobError(f"{data['module']}.{data['type']}: {message}")


def _loaded_class(module: str, qualname: str) -> type[Exception] | None:
    """The exception class ``module.qualname`` when it is loaded here already (never imported)."""
    found: Any = builtins if module == "builtins" else sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) and issubclass(found, Exception) else None
