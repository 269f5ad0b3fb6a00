"""``python -m benchmarks NAME [--records N] [--repeats R] [--json]``."""

from __future__ import annotations

import argparse

from benchmarks import (
    balance,
    checkpoint,
    cluster,
    columnar,
    cpu,
    enrich,
    joins,
    latency,
    monitor,
    offload,
    parallel,
    peers,
    placement,
    postgres,
    rescale,
    routing,
    spark,
    state,
    state_checkpoint,
    state_rescale,
    surge,
    tcp,
    windows,
    wordcount,
)
from benchmarks.common import emit


def main() -> None:
    """Run one benchmark and print its line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    names = [
        "wordcount",
        "columnar",
        "latency",
        "windows",
        "checkpoint",
        "tcp",
        "cluster",
        "spark",
        "routing",
        "rescale",
        "cpu",
        "balance",
        "surge",
        "placement",
        "monitor",
        "parallel",
        "offload",
        "peers",
        "joins",
        "enrich",
        "postgres",
        "state",
        "state-checkpoint",
        "state-rescale",
    ]
    parser.add_argument("name", choices=names)
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--keys", type=int, default=None, help="state: distinct keys (default 1 000 000)")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (checkpoint: 7)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--plot", default=None, help="surge: write a PNG of the run to this file")
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 7 if args.name == "checkpoint" else 5
    if args.name == "postgres":  # one line per measurement: the sink (upsert, append) and the source
        for each in postgres.main(args.records or 200_000, min(args.repeats, 3)):
            emit(each, args.json)
        return
    if args.name == "wordcount":
        line = wordcount.main(args.records or 1_000_000, args.repeats)
    elif args.name == "columnar":
        line = columnar.main(args.records or 1_000_000, args.repeats)
    elif args.name == "enrich":
        line = enrich.main(args.records or 20_000, args.repeats)
    elif args.name == "joins":
        line = joins.main(args.records or 1_000_000, args.repeats)
    elif args.name == "windows":
        line = windows.main(args.records or 1_000_000, args.repeats)
    elif args.name == "cluster":
        line = cluster.main(args.records or 1_000_000, min(args.repeats, 3))
    elif args.name == "tcp":
        line = tcp.main(args.records or 2_000_000, args.repeats)
    elif args.name == "spark":
        line = spark.main(args.records or 200_000, args.repeats)
    elif args.name == "surge":
        line = surge.main(args.plot)
    elif args.name == "monitor":
        line = monitor.main(args.records or 1_000_000, args.repeats)
    elif args.name == "peers":
        line = peers.main(args.records or 1_000_000, args.repeats)
    elif args.name == "offload":
        line = offload.main(args.records or 100_000, args.repeats)
    elif args.name == "parallel":
        line = parallel.main(args.records or 200_000, args.repeats)
    elif args.name == "placement":
        line = placement.main(args.repeats)
    elif args.name == "balance":
        line = balance.main(args.repeats)
    elif args.name == "cpu":
        line = cpu.main(min(args.repeats, 3))
    elif args.name == "rescale":
        line = rescale.main(0, args.repeats)
    elif args.name == "routing":
        line = routing.main(args.records or 2_000_000, args.repeats)
    elif args.name == "state":
        keys = args.keys or 1_000_000
        line = state.main(args.records or max(2_000_000, keys), min(args.repeats, 3), keys)
    elif args.name == "state-checkpoint":  # --records: the keys held
        line = state_checkpoint.main(args.records or 10_000_000, args.repeats)
    elif args.name == "state-rescale":  # --keys: the keys held
        line = state_rescale.main(args.keys or 1_000_000, min(args.repeats, 3))
    elif args.name == "checkpoint":
        line = checkpoint.main(args.records or 3_000_000, args.repeats)
    else:
        line = latency.main(args.records or 50_000, args.repeats)
    emit(line, args.json)


if __name__ == "__main__":
    main()
