"""What ``streamlet run`` prints: each collecting sink's first records, the statistics per node, and a footer.

Two renderings of the same facts: rich tables for people (plain text, no
colour and a fixed width when stdout is not a terminal, so a pipe or a test
sees stable output) and a JSON document for scripts.
"""

from __future__ import annotations

import io
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from streamlet.core.model.record import Record
from streamlet.core.runtime.job import JobResult
from streamlet.core.runtime.statistics import JobStatistics, NodeStatistics

DEFAULT_ROWS = 10
PLAIN_WIDTH = 120  # columns when stdout is not a terminal: wide enough for a window row's dict value
FIELDS = ("key", "value", "ts")
SORT_CHOICES = tuple(choice for field in FIELDS for choice in (field, f"-{field}"))
NO_OUT = "-"  # a sink emits nothing: its "out" is not a count


@dataclass(frozen=True)
class ReportOptions:
    """How much to show and in which order; where the run resumed from, if it did."""

    rows: int | None = None  # records per sink; None: DEFAULT_ROWS in the tables, every record in JSON
    sort: str | None = None  # one of SORT_CHOICES; None: the order the sink received them
    resumed_from: int | None = None  # the checkpoint epoch the job resumed from
    state_dir: Path | None = None


def print_report(result: JobResult, options: ReportOptions) -> None:
    """Print the report on stdout: rich on a terminal, plain text anywhere else (see :func:`plain_text`)."""
    if sys.stdout.isatty():
        render(Console(markup=False, emoji=False, highlight=False), result, options)
    else:
        encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        text = plain_text(result, options, encoding)
        sys.stdout.write(text.encode(encoding, "backslashreplace").decode(encoding))  # a value it cannot encode


class _Buffer(io.StringIO):
    """Text bound for a stream in ``encoding``: rich reads it to draw ASCII boxes when that is not UTF-8."""

    def __init__(self, encoding: str) -> None:
        super().__init__()
        self._encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding


def plain_text(result: JobResult, options: ReportOptions, encoding: str = "utf-8") -> str:
    """The report as text: no colour, PLAIN_WIDTH columns, no trailing spaces (rich pads every line of a table)."""
    buffer = _Buffer(encoding)
    console = Console(
        file=buffer,
        force_terminal=False,  # FORCE_COLOR or TTY_COMPATIBLE in the environment must not add escape codes
        width=PLAIN_WIDTH,
        color_system=None,
        markup=False,  # record values are data: "[bold]" in a value is text, never a style
        emoji=False,
        highlight=False,
    )
    render(console, result, options)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


# -- the facts ------------------------------------------------------------------------------------------------


def sorted_records(records: list[Record], sort: str | None) -> list[Record]:
    """``records`` ordered by ``sort`` (``"value"``, or ``"-value"`` for descending), ties by key, value, ts.

    Keys and values of any types sort: numbers by value, then strings, then
    anything else by its repr (see :func:`_order`).
    """
    if sort is None:
        return records
    field = sort.lstrip("-")
    by_all = sorted(records, key=lambda record: tuple(_order(getattr(record, name)) for name in FIELDS))
    # sorted() is stable, descending too: equal fields keep the key, value, ts order of by_all
    return sorted(by_all, key=lambda record: _order(getattr(record, field)), reverse=sort.startswith("-"))


def _order(value: Any) -> tuple[int, Any]:
    """A sort key that never compares unlike types: None, then numbers, then strings, then the rest by repr."""
    if value is None:
        return (0, 0)
    if isinstance(value, bool | int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, repr(value))


def source_records(stats: JobStatistics) -> int:
    """Records the sources emitted: what the job read."""
    return sum(node.records_out for node in stats.nodes.values() if node.kind == "source")


def rate(stats: JobStatistics) -> float | None:
    """Records per second from the sources over the job's wall time (``None`` for a zero wall time)."""
    return source_records(stats) / stats.wall_time if stats.wall_time > 0 else None


def records_out(node: NodeStatistics) -> int | None:
    """A node's records out; ``None`` for a sink, which emits nothing (a 0 would read as "lost everything")."""
    return None if node.kind == "sink" else node.records_out


def counters(stats: JobStatistics) -> dict[str, int]:
    """The job-wide counters, in the order the footer shows them."""
    return {
        "late": stats.late,
        "dropped": stats.dropped,
        "dead_lettered": stats.dead_lettered,
        "discarded": stats.discarded,
        "restarts": stats.restarts,
        "checkpoints": stats.checkpoints,
    }


def dead_letters_by_node(result: JobResult) -> Counter[str]:
    """How many records each task set aside (a task with ``on_error="skip"``); 0 for any other node."""
    return Counter(letter.task for letter in result.dead_letters)


def shown(records: list[Record], options: ReportOptions, default: int | None) -> list[Record]:
    """The records a report shows: sorted, then the first ``options.rows`` (else ``default``; None: all)."""
    limit = options.rows if options.rows is not None else default
    ordered = sorted_records(records, options.sort)
    return ordered if limit is None else ordered[:limit]


# -- JSON -------------------------------------------------------------------------------------------------------


def to_json(result: JobResult, options: ReportOptions) -> dict[str, Any]:
    """The report as one JSON-able document (every record of each sink unless ``options.rows``)."""
    stats, dead_letters = result.statistics, dead_letters_by_node(result)
    return {
        "job": stats.job,
        "wall_time": stats.wall_time,
        "source_records": source_records(stats),
        "records_per_second": rate(stats),
        "resumed_from": options.resumed_from,
        "state_dir": None if options.state_dir is None else str(options.state_dir),
        "nodes": [
            {
                "name": node.name,
                "kind": node.kind,
                "parallelism": node.parallelism,
                "in": node.records_in,
                "out": records_out(node),
                "dead_lettered": dead_letters[node.name],
            }
            for node in stats.nodes.values()
        ],
        "counters": counters(stats),
        "sinks": {
            name: {"total": len(records), "records": [_record_json(r) for r in shown(records, options, None)]}
            for name, records in result.collected().items()
        },
        "dead_letters": [
            {"task": d.task, "instance": d.instance, "record": _record_json(d.record), "error": d.error}
            for d in shown_dead_letters(result, options, None)
        ],
    }


def _record_json(record: Record) -> dict[str, Any]:
    window = record.window
    return {
        "key": jsonable(record.key),
        "value": jsonable(record.value),
        "ts": record.ts,
        "window": None if window is None else list(window),
    }


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: containers element by element, anything JSON has no type for as its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, dict):
        return {key if isinstance(key, str) else repr(key): jsonable(item) for key, item in value.items()}
    return repr(value)


def shown_dead_letters(result: JobResult, options: ReportOptions, default: int | None) -> list[Any]:
    """The dead letters a report shows, in the order they were set aside."""
    limit = options.rows if options.rows is not None else default
    return result.dead_letters if limit is None else result.dead_letters[:limit]


# -- tables -----------------------------------------------------------------------------------------------------


def render(console: Console, result: JobResult, options: ReportOptions) -> None:
    """Print the report: where it resumed from, each collecting sink, dead letters, statistics, footer."""
    stats = result.statistics
    if options.resumed_from is not None:
        console.print(f"resumed job '{stats.job}' from checkpoint {options.resumed_from} in {options.state_dir}")
        console.print()
    for name, records in result.collected().items():
        console.print(sink_table(name, records, options))
        console.print(_caption(len(shown(records, options, DEFAULT_ROWS)), len(records)))
        console.print()
    if result.dead_letters:
        console.print(dead_letter_table(result, options))
        console.print(_caption(len(shown_dead_letters(result, options, DEFAULT_ROWS)), len(result.dead_letters)))
        console.print()
    console.print(statistics_table(stats, dead_letters_by_node(result)))
    for line in footer(stats):
        console.print(line)


def _table(title: str) -> Table:
    # the caption is printed as a line of its own: a table's caption wraps at the table's width
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False)


def _caption(count: int, total: int) -> str:
    return f"showing {count} of {total} records"


def cell(value: Any) -> str:
    """A key or value as a table shows it: text as it is, anything else as its repr."""
    return value if isinstance(value, str) else repr(value)


def sink_table(name: str, records: list[Record], options: ReportOptions) -> Table:
    """The first records of sink ``name``; a window column when any of them comes from a window."""
    rows = shown(records, options, DEFAULT_ROWS)
    table = _table(f"sink '{name}'")
    table.add_column("key", no_wrap=True, overflow="ellipsis", max_width=40)
    table.add_column("value", no_wrap=True, overflow="ellipsis")
    table.add_column("ts", justify="right", no_wrap=True)
    windowed = any(record.window is not None for record in rows)
    if windowed:
        table.add_column("window", no_wrap=True)
    for record in rows:
        window = [] if not windowed else [_window(record.window)]
        table.add_row(cell(record.key), cell(record.value), repr(record.ts), *window)
    return table


def _window(window: tuple[float, float] | None) -> str:
    return "-" if window is None else f"[{window[0]!r}, {window[1]!r})"


def dead_letter_table(result: JobResult, options: ReportOptions) -> Table:
    """The first records tasks with ``on_error="skip"`` set aside, and why."""
    letters = shown_dead_letters(result, options, DEFAULT_ROWS)
    table = _table("dead letters")
    for name, justify in (("task", "left"), ("instance", "right"), ("key", "left"), ("error", "left")):
        table.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    for letter in letters:
        table.add_row(letter.task, str(letter.instance), cell(letter.record.key), letter.error)
    return table


def statistics_table(stats: JobStatistics, dead_letters: Counter[str]) -> Table:
    """One row per node: kind, parallelism, records in and out, records dead-lettered."""
    table = _table(f"job '{stats.job}'")
    table.add_column("node", no_wrap=True)
    table.add_column("kind")
    for name in ("parallelism", "in", "out", "dead-lettered"):
        table.add_column(name, justify="right")
    for node in stats.nodes.values():
        out = records_out(node)
        table.add_row(
            node.name, node.kind, str(node.parallelism), str(node.records_in),
            NO_OUT if out is None else str(out), str(dead_letters[node.name]),
        )  # fmt: skip
    return table


def footer(stats: JobStatistics) -> list[str]:
    """The job-wide counters, then the wall time and the rate from the sources."""
    counts = ", ".join(f"{name.replace('_', '-')} {count}" for name, count in counters(stats).items())
    per_second = rate(stats)
    speed = "" if per_second is None else f", {per_second:.0f} records/s"
    timing = f"finished in {stats.wall_time:.3f} s: {source_records(stats)} records from sources{speed}"
    return [counts, timing]
