"""The logical topology: nodes, ports and edges, as plain validated data.

Backends derive the physical plan (instances and channels) from it.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import AsyncIterable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from streamlet.core.model import graph
from streamlet.core.model.async_calls import AsyncFunction, MapAsyncTask, check_map_async
from streamlet.core.model.columnar import (
    AggregateEmit,
    AggregateHow,
    AggregateTask,
    WhereTask,
    check_aggregate,
    check_expression,
)
from streamlet.core.model.constants import LATE
from streamlet.core.model.joins import AsofJoin, IntervalJoin, JoinFunction, TableJoin, WindowJoin
from streamlet.core.model.joins.checks import check_grace, check_interval, join_window
from streamlet.core.model.lookups import Lookup, LookupFunction, LookupJoinTask, check_lookup_join
from streamlet.core.model.partition import ROUND_ROBIN, Partitioning, PartitionSpec
from streamlet.core.model.ports import PortDeclarer
from streamlet.core.model.qos import QoS
from streamlet.core.model.record import Record
from streamlet.core.model.run_in import RunIn, check_run_in
from streamlet.core.model.segments import DEFAULT_SEGMENTS
from streamlet.core.model.sinks import CallbackSink, Sink
from streamlet.core.model.sources import IterableSource, Source
from streamlet.core.model.state import StateBackend, check_state_backend
from streamlet.core.model.task import (
    FilterTask,
    FlatMapTask,
    KeyByTask,
    MapTask,
    ReduceEmit,
    ReduceTask,
    Task,
    WindowReduceTask,
)
from streamlet.core.model.validation import validate
from streamlet.core.model.watermarks import Watermarks
from streamlet.core.model.windows import BUILT_IN_FOLDS, FoldHow, WindowSpec
from streamlet.errors import TopologyError

NodeKind = Literal["source", "task", "sink"]
ErrorPolicy = Literal["fail", "skip", "restart"]
_POLICIES = ("fail", "skip", "restart")
#: Left records a bootstrapping ``table_join`` instance keeps waiting before it holds its left input back.
DEFAULT_BOOTSTRAP_BUFFER = 100_000


@dataclass(frozen=True, slots=True)
class Edge:
    """Output ``out_port`` of ``upstream`` feeds input ``in_port`` of ``downstream``."""

    upstream: str
    out_port: int
    downstream: str
    in_port: int
    partitioning: PartitionSpec


@dataclass(slots=True)
class Node:
    """One source, task or sink of a topology, before it is instantiated."""

    name: str
    kind: NodeKind
    parallelism: int
    inputs: int
    outputs: int
    sync: bool = False
    make_task: Callable[[], Task] | None = None
    source: Source | None = None
    sink: Sink | None = None
    config: dict[str, Any] = field(default_factory=dict)
    on_error: ErrorPolicy = "fail"
    max_failures: int = 3
    workers: tuple[str, ...] | None = None  # the only workers a cluster may run this node's instances on
    labels: tuple[str, ...] = ()  # a cluster runs this node's instances only on workers with all these labels
    window: WindowSpec | None = None  # a task's own window, or a source's window for its consumers
    windowed_ports: tuple[int, ...] = ()  # set by validation: the task's input ports that are windowed
    watermarks: Watermarks | None = None  # a source's watermark strategy (None: the default, if event time is used)
    on_timer: bool = False  # the task overrides Task.on_timer: watermarks must flow for its event-time timers
    state_ttl: float | None = None  # seconds of the job clock a task's state entry lives after its last write
    max_parallelism: int = DEFAULT_SEGMENTS  # key segments of a keyed input: the most instances it can have
    columnar: bool = False  # a columnar source, task or sink: Arrow batches reach it / leave it as they are
    async_calls: str = ""  # "map" (map_async) or "lookup" (lookup_join): its instance has calls in flight
    keyed_inputs: bool = False  # a join: every input must be partitioned by SAME_KEY
    run_in: RunIn = "loop"  # where a task's plain ``def execute`` runs: the event loop, a thread, a process
    state_backend: StateBackend | None = None  # where a task's keyed state lives (None: the job's choice)

    def describe(self) -> str:
        """``task 'count'`` style label used in messages."""
        return f"{self.kind} '{self.name}'"


class NodeHandle:
    """Returned by ``add_*``: connect the node's inputs with :meth:`set_input`."""

    __slots__ = ("_topology", "name")

    def __init__(self, topology: Topology, name: str) -> None:
        self._topology = topology
        self.name = name

    def set_input(
        self,
        upstream: NodeHandle | str,
        out_port: int = 0,
        in_port: int = 0,
        partitioning: PartitionSpec = ROUND_ROBIN,
    ) -> NodeHandle:
        """Feed input ``in_port`` of this node from ``upstream``'s ``out_port``."""
        if not isinstance(upstream, NodeHandle | str):
            raise TopologyError(
                f"{self._topology.node(self.name).describe()} input port {in_port}: "
                f"upstream must be a node handle or a node name, got {upstream!r}"
            )
        source = upstream.name if isinstance(upstream, NodeHandle) else upstream
        if not isinstance(partitioning, Partitioning) and not callable(partitioning):
            raise TopologyError(
                f"{self._topology.node(self.name).describe()} input port {in_port}: "
                "partitioning must be ROUND_ROBIN, SAME_KEY, SESSION_TABLE, BROADCAST or a function, "
                f"got {partitioning!r}"
            )
        self._topology.edges.append(Edge(source, out_port, self.name, in_port, partitioning))
        return self

    @property
    def late_port(self) -> int:
        """The output port of late records (``LATE``), for ``set_input(handle, out_port=handle.late_port)``."""
        return LATE

    def __repr__(self) -> str:
        return f"NodeHandle({self.name!r})"


class Topology:
    """Sources, tasks and sinks connected port to port.

    Example:
        >>> topology = Topology("wordcount")
        >>> lines = topology.add_source("lines", ["a b", "b"])
        >>> words = topology.flat_map("split", lambda r: [(w, 1) for w in r.value.split()])
        >>> _ = words.set_input(lines)
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise TopologyError(f"a topology needs a non-empty name, got {name!r}")
        self.name = name
        self.nodes: dict[str, Node] = {}
        self.edges: list[Edge] = []
        self.max_iterations: int | None = None
        self.loop_limits: dict[str, int] = {}
        self.qos: QoS | None = None

    # -- building ---------------------------------------------------------

    def set_qos(self, qos: QoS) -> Topology:
        """The job's quality of service: the latency to keep and what the ``shed`` policy may shed for it
        (see :class:`streamlet.QoS`). Records shed at a source go to its ``SHED`` port when one is connected."""
        if not isinstance(qos, QoS):
            raise TopologyError(f"set_qos takes a streamlet.QoS, got {qos!r:.80}")
        self.qos = qos
        return self

    def add_source(
        self,
        name: str,
        source: Source | Iterable[Any],
        parallelism: int = 1,
        window: WindowSpec | None = None,
        watermarks: Watermarks | None = None,
    ) -> NodeHandle:
        """Add a source; a plain iterable is wrapped in an ``IterableSource``.

        With ``window``, every task input this source feeds is windowed by it.
        ``watermarks`` says how its instances track event time (``Watermarks()``,
        out-of-orderness 0, when the job uses event time and it is not given).
        """
        if not isinstance(source, Source):
            if not isinstance(source, Iterable | AsyncIterable):
                raise TopologyError(f"source '{name}': expected a Source or an iterable, got {source!r}")
            source = IterableSource(source)
        _check_window(f"source '{name}'", window)
        if watermarks is not None:
            if not isinstance(watermarks, Watermarks):
                raise TopologyError(f"source '{name}': watermarks must be a Watermarks, got {watermarks!r}")
            watermarks.validate(f"source '{name}'")
        node = Node(
            name, "source", _parallelism(name, "source", parallelism), 0, 1,
            source=source, window=window, watermarks=watermarks, columnar=getattr(source, "columnar", False),
        )  # fmt: skip
        return self._add(node)

    def add_task(
        self,
        name: str,
        task: type[Task] | Callable[[], Task] | Task,
        parallelism: int = 1,
        config: dict[str, Any] | None = None,
        on_error: ErrorPolicy = "fail",
        max_failures: int = 3,
        window: WindowSpec | None = None,
        workers: list[str] | None = None,
        labels: list[str] | None = None,
        state_ttl: float | None = None,
        max_parallelism: int = DEFAULT_SEGMENTS,
        run_in: RunIn = "loop",
        state_backend: StateBackend | None = None,
    ) -> NodeHandle:
        """Add a task: a ``Task`` subclass or zero-argument factory (one object per instance).

        With ``window``, ``execute`` is called once per closed window of the
        task's input, and ``inputs.window`` gives its ``(start, end)``. On a
        cluster, ``workers`` names the only workers its instances may run on,
        and ``labels`` the labels a worker must carry (``streamlet worker --label``).
        With ``state_ttl``, an entry of ``self.state`` expires that many
        seconds of the job clock after it was last written. ``max_parallelism``
        is the number of key segments its keyed state and ``SAME_KEY`` input are
        split into: the most instances a rescale can give it (fixed for the life
        of the job and its checkpoints). ``run_in`` says where a plain ``def
        execute`` runs: on the event loop (``"loop"``, the default), in a thread
        (``"thread"``: blocking I/O leaves the loop free) or in a process of a
        pool (``"process"``: CPU-bound code uses other cores; stateless tasks
        only, see docs/model.md). ``state_backend`` keeps this task's
        ``self.state`` elsewhere than in memory (``RocksDBState``; the job's
        ``state_backend`` otherwise).
        """
        make_task = _task_factory(name, task)
        ports = PortDeclarer()
        try:
            probe = make_task()
        except TopologyError:
            raise
        except Exception as exc:
            raise TopologyError(
                f"task '{name}': making a task object failed with {type(exc).__name__}: {exc} (a class is called "
                f"with no arguments; to pass some, give a factory: lambda: MyTask(...))"
            ) from exc
        try:
            probe.declare_ports(ports)
        except TopologyError as exc:
            raise TopologyError(f"task '{name}': {exc}") from None
        if on_error not in _POLICIES:
            raise TopologyError(f"task '{name}': on_error must be one of {_POLICIES}, got {on_error!r}")
        _check_window(f"task '{name}'", window)
        _check_state_ttl(name, state_ttl)
        check_state_backend(f"task '{name}'", state_backend)
        check_run_in(name, run_in, probe, window=window, state_ttl=state_ttl)
        node = Node(
            name, "task", _parallelism(name, "task", parallelism, max_parallelism), ports.inputs, ports.outputs,
            ports.sync,
            make_task=make_task, config=dict(config or {}), on_error=on_error, max_failures=max_failures,
            window=window, workers=None if workers is None else tuple(workers), labels=tuple(labels or ()),
            on_timer=_tracks_event_time(probe), state_ttl=state_ttl, max_parallelism=max_parallelism,
            columnar=getattr(probe, "columnar", False), keyed_inputs=getattr(probe, "keyed_inputs", False),
            run_in=run_in, state_backend=state_backend,
        )  # fmt: skip
        return self._add(node)

    def add_sink(self, name: str, sink: Sink | Callable[[Record], Any], parallelism: int = 1) -> NodeHandle:
        """Add a sink; a plain callable becomes a ``CallbackSink``."""
        if not isinstance(sink, Sink):
            if not callable(sink):
                raise TopologyError(f"sink '{name}': expected a Sink or a callable, got {sink!r}")
            sink = CallbackSink(sink)
        node = Node(name, "sink", _parallelism(name, "sink", parallelism), 1, 0, sink=sink, columnar=sink.takes_columns)
        return self._add(node)

    def map(self, name: str, fn: Callable[[Record], tuple[Any, Any]], **options: Any) -> NodeHandle:
        """A task emitting ``fn(record) -> (key, value)`` for every record."""
        return self.add_task(name, lambda: MapTask(fn), **options)

    def map_async(
        self,
        name: str,
        fn: AsyncFunction,
        concurrency: int = 16,
        ordered: bool = True,
        timeout: float | None = None,
        **options: Any,
    ) -> NodeHandle:
        """A task emitting ``await fn(record) -> (key, value)`` for every record (``None`` drops it), with up
        to ``concurrency`` calls in flight per instance (Flink's Async I/O).

        Results keep their record's ``ts`` and come in input order when ``ordered``, else as the calls
        complete, but never past a watermark that followed their record. A call that takes longer than
        ``timeout`` seconds of real time (the event loop's clock, not the job clock) or raises is handled by
        ``on_error``: ``"fail"`` stops the job with a ``TaskError`` naming the task and the record's key,
        ``"skip"`` dead-letters the record, ``"restart"`` calls again. A full instance takes no more input
        (barriers aside); a checkpoint does not wait for calls in flight: it stores the records not yet
        answered (called again after a restore, so a call may repeat) and the answers held back by order.

        Example:
            >>> async def lookup(record):
            ...     return record.key, record.value * 2
            >>> topology = Topology("enrich")
            >>> numbers = topology.add_source("numbers", [("a", 1), ("b", 2)])
            >>> doubled = topology.map_async("double", lookup, concurrency=8).set_input(numbers)
        """
        check_map_async(name, fn, concurrency, ordered, timeout, options)
        handle = self.add_task(name, lambda: MapAsyncTask(fn, concurrency, ordered, timeout), **options)
        self.nodes[name].async_calls = "map"
        return handle

    def lookup_join(
        self,
        name: str,
        lookup: Lookup,
        how: str = "inner",
        fn: LookupFunction | None = None,
        cache_size: int = 10_000,
        cache_ttl: float | None = None,
        concurrency: int = 4,
        timeout: float | None = None,
        **options: Any,
    ) -> NodeHandle:
        """Join each record with its key's row from an outside store: ``await lookup(keys) -> {key: row}``
        is called with the distinct keys of a batch that are not cached (a key missing from the answer, or
        answered ``None``, has no row).

        The output is ``(key, fn(key, value, row))`` (``fn=None``: ``(value, row)``) with the record's
        ``ts``, in input order; ``how="inner"`` drops records without a row, ``"left"`` keeps them with
        ``row=None``. Up to ``concurrency`` lookups are in flight per instance. A lookup that raises, answers
        something other than a mapping or takes longer than ``timeout`` seconds of real time applies
        ``on_error`` to every record waiting for it (``"restart"`` looks up again). Answers, keys without a
        row included, are cached per instance: ``cache_size`` keys at most (least recently used evicted,
        ``0`` caches nothing), each for ``cache_ttl`` seconds of the job clock from its fetch (a hit does
        not extend it; ``None``: until evicted). A checkpoint does not wait for lookups in flight: records
        not yet joined are stored and looked up again after a restore. Wire the input with
        ``partitioning=SAME_KEY``, so that a key's records meet one instance's cache. A lookup with a
        ``connect()`` method (an async context manager giving the lookup function, e.g.
        ``PostgresLookup``'s pool of connections) is connected once per instance, for its lifetime.

        Example:
            >>> async def customers(keys):
            ...     return {key: {"name": key.title()} for key in keys if key != "nobody"}
            >>> topology = Topology("orders")
            >>> orders = topology.add_source("orders", [("ada", 10), ("nobody", 5)])
            >>> named = topology.lookup_join("customer", customers, how="left").set_input(
            ...     orders, partitioning=SAME_KEY
            ... )
        """
        limits = dict(cache_size=cache_size, cache_ttl=cache_ttl, concurrency=concurrency, timeout=timeout)
        check_lookup_join(name, lookup, how, fn, options, **limits)

        def make_task() -> LookupJoinTask:
            return LookupJoinTask(lookup, how, fn, cache_size, cache_ttl, concurrency, timeout)

        handle = self.add_task(name, make_task, **options)
        self.nodes[name].async_calls = "lookup"
        return handle

    def filter(self, name: str, fn: Callable[[Record], bool], **options: Any) -> NodeHandle:
        """A task passing on the records for which ``fn(record)`` is true."""
        return self.add_task(name, lambda: FilterTask(fn), **options)

    def flat_map(self, name: str, fn: Callable[[Record], Iterable[tuple[Any, Any]]], **options: Any) -> NodeHandle:
        """A task emitting every ``(key, value)`` of ``fn(record)``."""
        return self.add_task(name, lambda: FlatMapTask(fn), **options)

    def key_by(self, name: str, fn: Callable[[Record], Any], **options: Any) -> NodeHandle:
        """A task re-keying every record with ``fn(record)``."""
        return self.add_task(name, lambda: KeyByTask(fn), **options)

    def reduce(
        self, name: str, fn: Callable[[Any, Any], Any], *, emit: ReduceEmit = "batch", **options: Any
    ) -> NodeHandle:
        """A task folding values per key with ``fn(acc, value)``, emitting each key's running value once per
        batch, or after every record with ``emit="record"`` (see :class:`~streamlet.core.model.task.ReduceTask`)."""
        if emit not in ("batch", "record"):
            raise TopologyError(f"task '{name}': emit must be 'batch' or 'record', got {emit!r}")
        return self.add_task(name, lambda: ReduceTask(fn, emit), **options)

    def window_reduce(self, name: str, how: FoldHow, window: WindowSpec, **options: Any) -> NodeHandle:
        """Per window and key, fold the values: ``how`` is ``"sum"``, ``"count"``, ``"min"``, ``"max"``
        or ``fn(acc, value) -> acc`` (the first value of a key is its start).

        Values are folded as records arrive (nothing is buffered), and each
        closed window emits one ``(key, result)`` record per key, stamped with
        the window's last tick for time windows (the window's last record's ``ts`` for count windows). A late
        record (within ``allowed_lateness``) fires its own key's result again, once per record; an early
        firing fires each key that took records since its last early firing. Route its input by ``SAME_KEY`` when
        it runs in parallel. A fold that raises follows ``on_error``: ``"fail"`` (the default) stops the job,
        ``"skip"`` dead-letters the record and leaves nothing of it in any window, ``"restart"`` folds the
        batch again with a fresh task object (up to ``max_failures`` times).

        Example:
            >>> topology = Topology("clicks")
            >>> clicks = topology.add_source("clicks", [("home", 1), ("cart", 1), ("home", 1)])
            >>> per_page = topology.window_reduce("per-page", "sum", window=CountWindow(3)).set_input(clicks)
        """
        if not (callable(how) or how in BUILT_IN_FOLDS):
            raise TopologyError(f"task '{name}': how must be one of {BUILT_IN_FOLDS} or a function, got {how!r}")
        return self.add_task(name, lambda: WindowReduceTask(how), window=window, **options)

    def where(self, name: str, expression: Any, **options: Any) -> NodeHandle:
        """A columnar task keeping the rows for which ``expression`` (a ``pyarrow.compute`` expression over the
        batch's fields, e.g. ``pc.field("celsius") > 30``) is true; see :mod:`streamlet.core.model.columnar`."""
        check_expression(name, expression, options.get("on_error", "fail"))
        return self.add_task(name, lambda: WhereTask(expression), **options)

    def aggregate(
        self,
        name: str,
        how: AggregateHow,
        *,
        key: str | None = None,
        field: str | None = None,
        emit: AggregateEmit = "batch",
        **options: Any,
    ) -> NodeHandle:
        """A columnar task folding ``field`` per ``key`` (column names; default: the batch's key and value
        columns) with ``how`` (``"count"``, ``"sum"``, ``"min"``, ``"max"``, ``"mean"``) in Arrow.

        With ``emit="batch"`` (like ``reduce``) it emits, after each batch, one row per key the batch
        touched, in the order the keys first appear in it, with the key's value then and the ``ts`` of its
        last row; with ``emit="end"``, every key's final value once the input ends. Results are columnar
        batches with the fields ``key``, ``value`` (and ``ts``). Route its input by ``SAME_KEY`` when it
        runs in parallel.

        With ``window=TimeWindow(size, time="event")`` (tumbling, event time, no other option: anything else
        is refused) it holds each window's rows in Arrow and, when the watermark passes the window's end,
        aggregates them at once and emits the window as one columnar batch with the fields ``key``,
        ``value``, ``ts`` (the window's last tick), ``window_start`` and ``window_end``: to a columnar node
        or sink as it is, to any other node as the records ``window_reduce`` on that window emits. Late rows
        are counted and sent to the ``LATE`` port."""
        check_aggregate(
            name, how, emit, options.get("state_ttl"), options.get("window"), options.get("on_error", "fail")
        )
        return self.add_task(name, lambda: AggregateTask(how, key, field, emit), **options)

    def interval_join(
        self, name: str, lower: float, upper: float, how: str = "inner", fn: JoinFunction | None = None, **options: Any
    ) -> NodeHandle:
        """Join ``LEFT`` and ``RIGHT`` records of the same key whose event times are close (Flink's interval join).

        A left record ``a`` and a right record ``b`` pair when ``a.ts + lower <= b.ts <= a.ts + upper``
        (both bounds inclusive; either may be negative). Each pair is emitted once, when its second record
        arrives, as ``(key, fn(key, a.value, b.value))`` with ``ts = max(a.ts, b.ts)``; the default ``fn``
        gives ``(a.value, b.value)``. With ``how="left"``, ``"right"`` or ``"outer"``, a record that never
        paired is emitted with ``None`` on the other side (and its own ``ts``) once the watermark is greater
        than the last time at which an on-time record of the other side could still pair with it
        (``a.ts + max(upper, 0)``; ``b.ts + max(-lower, 0)``); a record is dropped from state at the same
        moment. A record whose ``ts`` is behind the join's watermark when it arrives is late: it goes to the
        ``LATE`` port (``statistics.late``) and pairs with nothing. Wire both inputs with
        ``partitioning=SAME_KEY``.

        Example:
            >>> from streamlet import LEFT, RIGHT, SAME_KEY, Record
            >>> topology = Topology("orders")
            >>> orders = topology.add_source("orders", [Record("o1", "order", 1.0)])
            >>> payments = topology.add_source("payments", [Record("o1", "paid", 60.0)])
            >>> paid = topology.interval_join("paid", 0.0, 600.0)  # paid within 10 minutes of the order
            >>> _ = paid.set_input(orders, in_port=LEFT, partitioning=SAME_KEY)
            >>> _ = paid.set_input(payments, in_port=RIGHT, partitioning=SAME_KEY)
        """
        check_interval(name, lower, upper)
        _check_join(name, IntervalJoin.kinds, how, fn, options, ttl=False)
        return self.add_task(name, lambda: IntervalJoin(lower, upper, how, fn), **options)

    def window_join(
        self, name: str, window: WindowSpec, how: str = "inner", fn: JoinFunction | None = None, **options: Any
    ) -> NodeHandle:
        """Join ``LEFT`` and ``RIGHT`` records of the same key that fall in the same window.

        ``window`` is a ``TimeWindow`` (tumbling or sliding, event or processing time) or a
        ``SessionWindow`` (per key over both inputs: a record of either side extends the session). When a
        window of a key fires, every (left, right) pair of that key in it is emitted, left-major and each side
        in arrival order, as ``(key, fn(key, left, right))`` stamped with the window's last tick and carrying
        its bounds (``window_start``/``window_end``); with an outer ``how``, the records of a side that
        found no partner in that window are emitted with ``None`` for the other. Late records go to the
        ``LATE`` port, and on event time a record without ``ts`` fails the job (a ``TaskError``). Each window
        fires once: ``allowed_lateness`` and ``early_firing`` are refused. Wire both inputs with
        ``partitioning=SAME_KEY``.
        """
        window = join_window(name, window)
        if "window" in options:
            raise TopologyError(f"task '{name}': window_join takes its window as its second argument, not window=")
        _check_join(name, WindowJoin.kinds, how, fn, options, ttl=False)
        return self.add_task(name, lambda: WindowJoin(how, fn), window=window, **options)

    def table_join(
        self,
        name: str,
        how: str = "inner",
        fn: JoinFunction | None = None,
        bootstrap: bool = False,
        bootstrap_buffer: int = DEFAULT_BOOTSTRAP_BUFFER,
        **options: Any,
    ) -> NodeHandle:
        """Join each ``LEFT`` record with its key's row of a table that ``RIGHT`` keeps (Kafka Streams'
        KStream-KTable join), in processing order.

        A right record sets its key's row to its value (``None`` deletes the row) and emits nothing. A left
        record is joined with the row its key holds when it is processed: ``how="inner"`` emits
        ``(key, fn(key, value, row))`` only when there is a row, ``"left"`` emits ``fn(key, value, None)``
        without one; ``ts`` is the left record's. ``state_ttl`` expires rows that long after their last
        write. Wire both inputs with ``partitioning=SAME_KEY``.

        ``bootstrap=True`` loads the table before joining (Kafka Streams' GlobalKTable): left records wait
        until every source feeding ``RIGHT`` has caught up (a bounded source ended, a ``PostgresSource``
        finished its snapshot, a Kafka source reached the end offsets it saw at start:
        ``SourceReader.caught_up``), then each is joined with the table as it is then, each key's in arrival
        order. Waiting records are kept in the checkpointed state; once ``bootstrap_buffer`` of them wait in
        one instance, its ``LEFT`` input is held back (backpressure). On every start (a restore too) the
        join waits again, with the restored rows in place. ``state_ttl`` is refused with it (it would expire
        waiting records).
        """
        _check_join(name, TableJoin.kinds, how, fn, options, ttl=True)
        _check_bootstrap(name, bootstrap, bootstrap_buffer, options.get("state_ttl"))
        return self.add_task(name, lambda: TableJoin(how, fn, bootstrap, bootstrap_buffer), **options)

    def asof_join(
        self,
        name: str,
        how: str = "inner",
        fn: JoinFunction | None = None,
        grace: float | None = None,
        **options: Any,
    ) -> NodeHandle:
        """Join each ``LEFT`` record with the ``RIGHT`` record of its key that has the greatest ``ts <=``
        its own (Flink's event-time temporal join), deterministically.

        The result is emitted once the watermark is greater than the left record's ``ts`` (so it depends
        neither on arrival order nor on parallelism), as ``(key, fn(key, value, right_value))`` with the
        left record's ``ts``; ``how="left"`` emits ``fn(key, value, None)`` when no right record qualifies.
        Among right records of equal ``ts`` the last in its channel's order wins (deterministic when one
        upstream instance produces a key's right records). A right value of ``None`` ends the key's row
        from its ``ts`` on. With watermark ``W`` the right records kept are those with ``ts > W - grace``
        and the newest one at or before ``W - grace`` (``grace=None``: 0); a left record at most ``grace``
        behind the watermark is still joined with them, one further behind goes to the ``LATE`` port. Wire
        both inputs with ``partitioning=SAME_KEY``.
        """
        check_grace(name, grace)
        _check_join(name, AsofJoin.kinds, how, fn, options, ttl=False)
        return self.add_task(name, lambda: AsofJoin(how, fn, grace), **options)

    def set_max_iterations(self, limit: int, at: NodeHandle | str | None = None) -> None:
        """Allow cycles: a record goes round a loop at most ``limit`` times.

        ``at`` names the node a loop's back edge enters, for a per-loop limit;
        without it the limit applies to every loop.
        """
        if not isinstance(limit, int) or limit < 1:
            raise TopologyError(f"topology '{self.name}': max_iterations must be >= 1, got {limit!r}")
        if at is None:
            self.max_iterations = limit
        else:
            self.loop_limits[at.name if isinstance(at, NodeHandle) else at] = limit

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        return self.nodes[name]

    def _add(self, node: Node) -> NodeHandle:
        if node.name in self.nodes:
            raise TopologyError(f"{node.describe()}: topology '{self.name}' already has a node with that name")
        self.nodes[node.name] = node
        return NodeHandle(self, node.name)

    # -- reading ----------------------------------------------------------

    def successors(self) -> dict[str, list[str]]:
        """Downstream node names of every node, in edge order."""
        following: dict[str, list[str]] = {name: [] for name in self.nodes}
        for edge in self.edges:
            if edge.downstream not in following[edge.upstream]:
                following[edge.upstream].append(edge.downstream)
        return following

    def back_edges(self) -> set[tuple[str, str]]:
        """``(upstream, downstream)`` pairs that close a cycle."""
        sources = [name for name, node in self.nodes.items() if node.kind == "source"]
        return graph.back_edges(sources, self.successors())

    def uses_event_time(self) -> bool:
        """Whether watermarks must flow: some window runs on event time, a source declares watermarks,
        or a task has timers (it overrides ``on_timer``)."""
        return any(node.watermarks is not None or _on_event_time(node) for node in self.nodes.values())

    def loop_limit(self, head: str) -> int | None:
        """Iteration limit of the loop whose back edge enters ``head``."""
        return self.loop_limits.get(head, self.max_iterations)

    def describe(self) -> dict[str, Any]:
        """The topology as plain data (for printing, or shipping by reference)."""
        return {
            "name": self.name,
            "nodes": [
                {"name": n.name, "kind": n.kind, "parallelism": n.parallelism, "inputs": n.inputs,
                 "outputs": n.outputs, "sync": n.sync, "on_error": n.on_error}
                for n in self.nodes.values()
            ],
            "edges": [
                {"from": e.upstream, "out_port": e.out_port, "to": e.downstream, "in_port": e.in_port,
                 "partitioning": e.partitioning.name if isinstance(e.partitioning, Partitioning) else "custom"}
                for e in self.edges
            ],
        }  # fmt: skip

    def validate(self) -> Topology:
        """A resolved copy of this topology (every task with the window it runs with), or a
        ``TopologyError`` naming the node and port of the first problem. This topology is left as it is."""
        return validate(self)


_WINDOW_KINDS = "a CountWindow, TimeWindow, SessionWindow or CountOrTimeWindow"


def _check_window(where: str, window: WindowSpec | None) -> None:
    if window is None:
        return
    if not isinstance(window, WindowSpec):
        raise TopologyError(f"{where}: window must be {_WINDOW_KINDS}, got {window!r}")
    window.validate(where)


def _check_join(name: str, kinds: tuple[str, ...], how: Any, fn: Any, options: dict[str, Any], *, ttl: bool) -> None:
    """What every join refuses: a ``how`` it does not take, an ``fn`` that is not callable, a TTL on state
    that the watermark bounds."""
    if how not in kinds:
        raise TopologyError(f"task '{name}': how must be one of {kinds}, got {how!r}")
    if fn is not None and not callable(fn):
        raise TopologyError(f"task '{name}': fn must be a function fn(key, left_value, right_value), got {fn!r}")
    if not ttl and options.get("state_ttl") is not None:
        raise TopologyError(f"task '{name}': this join's state is dropped by the watermark; state_ttl is refused")


def _check_bootstrap(name: str, bootstrap: Any, buffer: Any, state_ttl: Any) -> None:
    if type(bootstrap) is not bool:
        raise TopologyError(f"task '{name}': bootstrap must be True or False, got {bootstrap!r}")
    if type(buffer) is not int or buffer < 1:
        raise TopologyError(f"task '{name}': bootstrap_buffer must be a whole number of records >= 1, got {buffer!r}")
    if bootstrap and state_ttl is not None:
        raise TopologyError(
            f"task '{name}': state_ttl is refused with bootstrap=True (it would expire left records still waiting "
            "for the table)"
        )


def _check_state_ttl(name: str, state_ttl: float | None) -> None:
    if state_ttl is None:
        return
    if type(state_ttl) is bool or not isinstance(state_ttl, int | float) or not state_ttl > 0:
        raise TopologyError(f"task '{name}': state_ttl must be a number of seconds > 0, got {state_ttl!r}")


def _parallelism(name: str, kind: str, parallelism: int, max_parallelism: int = DEFAULT_SEGMENTS) -> int:
    if type(max_parallelism) is not int or max_parallelism < 1:
        raise TopologyError(f"{kind} '{name}': max_parallelism must be a whole number >= 1, got {max_parallelism!r}")
    if type(parallelism) is not int or parallelism < 1:
        raise TopologyError(f"{kind} '{name}': parallelism must be >= 1, got {parallelism!r}")
    if parallelism > max_parallelism:
        raise TopologyError(
            f"{kind} '{name}': parallelism {parallelism} is more than max_parallelism {max_parallelism} "
            "(the number of key segments, so the most instances it can have); raise max_parallelism"
        )
    return parallelism


def _task_factory(name: str, task: type[Task] | Callable[[], Task] | Task) -> Callable[[], Task]:
    if isinstance(task, Task):
        prototype = task
        return lambda: copy.deepcopy(prototype)
    if inspect.isclass(task):
        return _class_factory(name, task)
    if not callable(task):
        raise TopologyError(f"task '{name}': expected a Task subclass or a factory, got {task!r}")
    if _takes_arguments(task):
        raise TopologyError(
            f"task '{name}': add_task takes a Task subclass or a zero-argument factory, got the function "
            f"{_label(task)}{inspect.signature(task)}; for a function of each record use "
            f"topology.map('{name}', fn) (or filter, flat_map, key_by, reduce)"
        )

    def make() -> Task:
        made = task()
        if not isinstance(made, Task):
            raise TopologyError(f"task '{name}': the factory returned {made!r}, not a Task")
        return made

    return make


def _class_factory(name: str, task: type[Any]) -> Callable[[], Task]:
    if not issubclass(task, Task):
        raise TopologyError(f"task '{name}': {task.__name__} is not a subclass of streamlet.Task")
    if inspect.isabstract(task):
        missing = ", ".join(sorted(getattr(task, "__abstractmethods__", ())))
        raise TopologyError(f"task '{name}': {task.__name__} does not define {missing}(self, inputs, outputs)")
    return task


def _takes_arguments(fn: Callable[..., Any]) -> bool:
    """A function that cannot be called with no arguments: a per-record function, not a factory."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return False
    return any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        for p in signature.parameters.values()
    )


def _label(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", type(fn).__name__)
    return "lambda" if name == "<lambda>" else name


def _tracks_event_time(task: Task) -> bool:
    """The task overrides ``on_timer`` (it may set event-time timers) or is an event-time join."""
    return type(task).on_timer is not Task.on_timer or getattr(task, "event_time", False)


def _on_event_time(node: Node) -> bool:
    """The node's window follows event time, or its task may have event-time timers."""
    return node.on_timer or getattr(node.window, "time", None) == "event"
