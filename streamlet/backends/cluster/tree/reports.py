"""Dead letters in a worker's report, kept small: a report is one ZooKeeper node (1 MB at most).

A worker whose part set records aside (``on_error="skip"``) adds
``{"count": N, "first": [...]}`` to its report under ``dead_letters``: how
many, and the first :data:`FIRST` as short lines (``task.index key=... value=...:
error``). ``streamlet jobs`` adds up the counts of the attempt's reports and
shows the first lines.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

from streamlet.core.model.record import DeadLetter

FIRST = 5  # dead letters a report describes
LINE = 200  # characters per described dead letter, at most
_short = reprlib.Repr()  # keys and values abridged: 40 characters, 4 items
_short.maxstring = _short.maxother = 40
_short.maxlist = _short.maxdict = _short.maxtuple = _short.maxset = 4


def describe_dead_letter(letter: DeadLetter) -> str:
    """One short line: the instance, the record's key and value (abridged) and the error.

    Example:
        >>> import streamlet as sl
        >>> letter = sl.DeadLetter("parse", 0, sl.Record("k", 500, 0.0), "ValueError: poison", ValueError())
        >>> describe_dead_letter(letter)
        "parse.0 key='k' value=500: ValueError: poison"
    """
    record = letter.record
    line = f"{letter.task}.{letter.instance} key={_short.repr(record.key)} value={_short.repr(record.value)}: "
    line += letter.error
    return line if len(line) <= LINE else line[: LINE - 3] + "..."


def dead_letters_report(letters: list[DeadLetter]) -> dict[str, Any] | None:
    """What a report says of ``letters``: their count and the first few described (``None``: there are none)."""
    if not letters:
        return None
    return {"count": len(letters), "first": [describe_dead_letter(letter) for letter in letters[:FIRST]]}


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """A job's dead letters as its workers reported them: how many, and the first few, worker by worker."""

    count: int
    first: list[str]


def dead_letters_of(done: dict[str, dict[str, Any]]) -> DeadLetters:
    """The dead letters in an attempt's reports (``worker -> report``, as ``job_status`` gives them under
    ``done``); the first :data:`FIRST` lines, taken worker by worker in name order."""
    count, first = 0, list[str]()
    for worker in sorted(done):
        found = done[worker].get("dead_letters") or {}
        count += int(found.get("count", 0))
        first.extend(str(line) for line in found.get("first", []))
    return DeadLetters(count, first[:FIRST])
