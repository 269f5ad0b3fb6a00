"""Reading what ``streamlet run`` prints as plain text: its tables by title, its rows as cells, its footer."""

from __future__ import annotations

import re

#: The last line: wall time, records from the sources (group 1), rate.
TIMING = re.compile(r"finished in \d+\.\d{3} s: (\d+) records from sources, \d+ records/s")
COUNTERS_ZERO = "late 0, dropped 0, dead-lettered 0, discarded 0, restarts 0, checkpoints 0"


def section(stdout: str, title: str) -> list[str]:
    """The lines of the table titled ``title`` (header first, without the rule under it) up to its end."""
    lines = stdout.splitlines()
    start = lines.index(title) + 1
    end = start
    while end < len(lines) and lines[end] and not lines[end].startswith(("showing ", "late ")):
        end += 1
    return [line for line in lines[start:end] if set(line) != {"─"}]


def rows(stdout: str, title: str) -> list[list[str]]:
    """The cells of table ``title``'s rows (split on runs of two spaces or more), without the header."""
    return [re.split(r"\s{2,}", line.strip()) for line in section(stdout, title)[1:]]


def caption(stdout: str, sink: str) -> str:
    """The line right under the table of sink ``sink``: ``showing N of M records``."""
    lines = stdout.splitlines()
    return lines[lines.index(f"sink '{sink}'") + len(section(stdout, f"sink '{sink}'")) + 2]


def node_rows(stdout: str, job: str) -> list[list[str]]:
    """The statistics table of job ``job``: node, kind, parallelism, in, out, dead-lettered."""
    return rows(stdout, f"job '{job}'")
