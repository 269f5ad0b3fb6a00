"""How the ``streamlet`` command's processes log: level and format, set up by the command only.

The library never configures logging: embedded in an application, its
structlog lines go wherever that application sends them. The ``streamlet``
command (``run``, ``submit``, ``master``, ``worker``, ...) calls
:func:`configure_logging` once, from the options of its top-level group::

    streamlet --log-level info --log-format json worker --zk 127.0.0.1:2181

Lines carry what their code knows: ``job`` and ``attempt`` for a worker's
part of a job, ``task`` and ``instance`` for an instance. ``json`` prints one
JSON object per line (``event``, ``level``, ``timestamp`` and the bound
keys); ``console`` prints them readable. The standard library's loggers
(kazoo's, aiokafka's) go through the same renderer at the same level.
``cluster up`` hands the settings to the processes it starts through the
environment (:meth:`LogSettings.environment`), where the options read them.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

from streamlet.redaction import scrub

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("console", "json")
LEVEL_ENV = "STREAMLET_LOG_LEVEL"
FORMAT_ENV = "STREAMLET_LOG_FORMAT"


@dataclass(frozen=True, slots=True)
class LogSettings:
    """A level (``debug``, ``info``, ``warning``, ``error``) and a format (``console`` or ``json``).

    Example:
        >>> LogSettings("info", "json").environment()
        {'STREAMLET_LOG_LEVEL': 'info', 'STREAMLET_LOG_FORMAT': 'json'}
    """

    level: str = "warning"
    format: str = "console"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"log level {self.level!r} is not one of {', '.join(LEVELS)}")
        if self.format not in FORMATS:
            raise ValueError(f"log format {self.format!r} is not one of {', '.join(FORMATS)}")

    def environment(self) -> dict[str, str]:
        """The variables that give a ``streamlet`` child process these settings."""
        return {LEVEL_ENV: self.level, FORMAT_ENV: self.format}

    @classmethod
    def from_data(cls, data: dict[str, Any] | None) -> LogSettings | None:
        """Settings as ``cluster.json`` records them (``None``: none recorded)."""
        return None if data is None else cls(str(data["level"]), str(data["format"]))


class RepeatedLibraryLines(logging.Filter):
    """Lets a library's line through once per ``window`` seconds per *shape* (its text with numbers and
    addresses taken out): kazoo says "Connection dropped: ..." for every try while a ZooKeeper member is down,
    thirteen lines for one event; the first says it, the rest say nothing new. streamlet's own lines all pass."""

    LIBRARIES = ("kazoo", "aiokafka")

    def __init__(self, window: float = 60.0) -> None:
        super().__init__()
        self.window = window
        self._shown: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.LIBRARIES):
            return True
        shape = (record.name, re.sub(r"[0-9a-fA-F.:\[\]]*[0-9][0-9a-fA-F.:\[\]]*", "#", record.getMessage()))
        last = self._shown.get(shape)
        if last is not None and record.created - last < self.window:
            return False
        self._shown[shape] = record.created
        return True


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a line is logged (a test may have replaced it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    return structlog.PrintLogger(sys.stderr)


def scrub_secrets(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """A processor: every text in the line with the passwords of the DSNs it quotes masked (an error's text
    may quote one; a log file is read by more people than the database's owner)."""
    return {key: scrub(value) if isinstance(value, str) else value for key, value in event.items()}


def configure_logging(settings: LogSettings) -> None:
    """Send structlog's and the standard library's lines at ``settings.level`` or above to stderr, rendered
    as ``settings.format`` says. For the command's entry points only; calling it again replaces the setup."""
    level = getattr(logging, settings.level.upper())
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        scrub_secrets,
    ]
    renderer: Processor
    if settings.format == "json":
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[*shared, renderer],
        logger_factory=_stderr_logger,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    foreign = [*shared, structlog.stdlib.add_logger_name]  # kazoo's, aiokafka's: which library said it
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(foreign_pre_chain=foreign, processors=[
        structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer,
    ]))  # fmt: skip
    handler.set_name("streamlet")
    handler.addFilter(RepeatedLibraryLines())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "streamlet"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
