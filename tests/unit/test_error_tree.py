"""Every error a user can meet is a ``StreamletError`` defined in ``streamlet.errors``."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil

import streamlet
import streamlet as sl
from streamlet import errors
from streamlet.errors import described, underlying

# Never raised to a user: control flow inside the runtime (a shortcut task or a callback sink marks the record
# that failed; the encoder stops at the first tuple), or a decoding refusal that the boundary meeting it turns
# into a FrameError (TCP) or a skipped, corrupt checkpoint file.
INTERNAL = {
    "streamlet.core.model.task.RecordFailure",
    "streamlet.core.model.sinks.WriteFailed",
    "streamlet.core.model.encoding._TupleFound",
    "streamlet.core.model.encoding.ExtensionError",
}


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a streamlet module, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(streamlet.__path__, "streamlet."):
        if module_info.name.endswith("__main__"):
            continue  # importing it runs the command line
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_exception_class_is_defined_in_errors_and_derives_from_streamlet_error() -> None:
    """Strays (an error class defined next to the code that raises it) join the one tree."""
    classes = exception_classes()
    strays = sorted(name for name in classes if name not in INTERNAL and not name.startswith("streamlet.errors."))
    assert strays == []
    outside = sorted(n for n, c in classes.items() if n not in INTERNAL and not issubclass(c, errors.StreamletError))
    assert outside == []


def test_the_moved_errors_are_still_importable_where_they_are_raised() -> None:
    """Code that imported an error from its old module keeps working: it is the same class."""
    from streamlet.adaptation.dispatch import DispatchError
    from streamlet.backends.cluster.tree.store import CoordinationError
    from streamlet.connectors.kafka import KafkaError
    from streamlet.transport.codec import FrameError

    assert (DispatchError, CoordinationError, KafkaError, FrameError) == (
        errors.DispatchError, errors.CoordinationError, errors.KafkaError, errors.FrameError,
    )  # fmt: skip
    assert streamlet.KafkaError is errors.KafkaError


def test_the_docstring_tree_lists_every_error() -> None:
    """The map at the top of errors.py names every class it defines."""
    defined = {n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.StreamletError)}
    listed = {word for word in (errors.__doc__ or "").split() if word in defined}
    assert listed == defined


def test_a_task_groups_errors_are_reported_by_what_failed_inside() -> None:
    """``ExceptionGroup: unhandled errors in a TaskGroup`` says nothing: a reason names the first error inside
    (depth first, cancellations skipped) and how many more there were; a plain error is itself."""
    sink = sl.SinkError("sink 'out' instance 0: column 'n' refused its value", sink="out", instance=0, key="k")
    nested = ExceptionGroup("unhandled errors in a TaskGroup", [ExceptionGroup("inner", [sink])])
    assert underlying(nested) is sink
    assert described(nested) == f"SinkError: {sink}"
    several = BaseExceptionGroup("outer", [asyncio.CancelledError(), nested, ValueError("bad")])
    assert (underlying(several), described(several)) == (sink, f"SinkError: {sink} (and 1 more)")
    only_cancelled = BaseExceptionGroup("outer", [asyncio.CancelledError()])
    assert underlying(only_cancelled) is only_cancelled
    assert described(KeyError("k")) == "KeyError: 'k'"
