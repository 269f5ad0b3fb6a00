"""Records/s through one TCP channel between two processes, next to a raw asyncio socket + msgpack.

The parent process sends, a child process receives and measures. streamlet:
a ``TcpChannel`` into a ``DataServer`` feeding an inbox; the figure counts
records taken out of the inbox as the runtime carries them (``(key, value,
ts)`` tuples, decoded and checked column by column). Raw baseline: the same
rows as length-prefixed msgpack arrays over a plain asyncio socket, only
unpacked into tuples. The same streamlet channel over mutual TLS (certificates
of a throwaway cluster CA, as ``cluster up`` makes them) gives ``tls_records_per_s``
and ``tls_ratio`` (TLS over cleartext streamlet; target >= 0.5). Then latency:
streamlet paced at half of its peak rate, from the sender stamping a batch to
the receiving task taking it.
Run the receiving side alone with ``python -m benchmarks.tcp receive MODE RECORDS [TLS_DIR]``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import uvloop

from benchmarks.common import latency_ms, report
from streamlet.backends.cluster.local import certificates
from streamlet.core.model.record import Batch
from streamlet.core.runtime.channel import Inbox
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from streamlet.transport.tls import TlsSettings

SECRET = b"benchmark secret"
BATCH = 1000
WINDOW = 8  # batches of credit
LENGTH = struct.Struct(">I")


def batch_of(ts: float = 1.7e9, key: str = "user42") -> Batch:
    """1000 records shaped like ``("user42", 123, 1.7e9)``, as the runtime carries them."""
    return [(key, 123, ts) for _ in range(BATCH)]


# -- receiving side (child process) -------------------------------------------


def tls_of(folder: str | None, process: str) -> TlsSettings | None:
    """``process``'s TLS settings from a folder of certificates (``None``: cleartext)."""
    if folder is None:
        return None
    files = certificates.ProcessFiles.of(Path(folder), process)
    return TlsSettings(files.ca, files.cert, files.key)


async def receive_streamlet(records: int, latency: bool, tls: str | None = None) -> dict[str, Any]:
    inbox = Inbox(WINDOW)
    channel = inbox.add_channel(0)
    async with DataServer(SECRET, tls=tls_of(tls, "receiver")) as server:
        server.register("bench", inbox, channel)
        print(server.port, flush=True)
        count, lags, began = 0, [], 0.0
        while count < records:
            if inbox.is_empty(channel):
                await inbox.wait()
                continue
            batch = inbox.pop(channel)
            assert type(batch) is list
            assert type(batch[0]) is tuple
            if not began:
                began, first = time.perf_counter(), len(batch)
            if batch[0][0] == "warm-up":
                continue  # sent before timing starts, so connection set-up is not measured
            if latency:
                lags.append(time.time() - batch[0][2])
            count += len(batch)
        elapsed = time.perf_counter() - began
        await asyncio.sleep(0.1)  # let the last acknowledgements reach the sender before closing
    return {"records_per_s": (count - first) / elapsed, "lags": lags}


async def receive_raw(records: int) -> dict[str, Any]:
    done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count, began = 0, 0.0
        while count < records:
            (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
            rows = msgpack.unpackb(await reader.readexactly(length), use_list=False)
            if not began:
                began, first = time.perf_counter(), len(rows)
            count += len(rows)
        done.set_result({"records_per_s": (count - first) / (time.perf_counter() - began)})
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    result = await done
    server.close()
    await server.wait_closed()
    return result


# -- sending side (this process) ---------------------------------------------------


async def send_streamlet(port: int, records: int, rate: float | None, tls: str | None = None) -> None:
    async with TcpClient(SECRET, tls=tls_of(tls, "sender")) as client:
        channel = client.channel(("127.0.0.1", port), "bench", peer=None if tls is None else "receiver")
        await channel.send(batch_of(key="warm-up"))
        async with asyncio.timeout(60):
            await channel.wait_acknowledged()  # connected, authenticated and acknowledged: now measure
        batch = batch_of()
        began = time.perf_counter()
        for index in range(records // BATCH):
            if rate is None:
                await channel.send(batch)
                continue
            await channel.send(batch_of(time.time()))
            delay = began + (index + 1) * BATCH / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        async with asyncio.timeout(60):
            await channel.wait_acknowledged()  # the receiver has everything


async def send_raw(port: int, records: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    rows = [("user42", 123, 1.7e9)] * BATCH
    for _ in range(records // BATCH):
        body = msgpack.packb(rows)
        writer.write(LENGTH.pack(len(body)) + body)
        await writer.drain()
    await reader.read()  # the receiver closes when it has everything
    writer.close()


def measure(mode: str, records: int, rate: float | None = None, tls: str | None = None) -> dict[str, Any]:
    """Start a receiver process, send to it from here, return what it measured (``tls``: the certificates'
    folder, for mode ``tls``)."""
    role = "latency" if rate is not None else mode
    command = [sys.executable, "-m", "benchmarks.tcp", "receive", role, str(records), *([tls] if tls else [])]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        sender = send_raw(port, records) if mode == "raw" else send_streamlet(port, records, rate, tls)
        uvloop.run(asyncio.wait_for(sender, timeout=120))
        result: dict[str, Any] = json.loads(child.stdout.readline())
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
    return result


def main(records: int, repeats: int) -> dict[str, Any]:
    """Peak rates, rotating which goes first; then latency at half of streamlet's peak."""
    rates: dict[str, list[float]] = {"streamlet": [], "raw": [], "tls": []}
    with tempfile.TemporaryDirectory(prefix="streamlet-tcp-bench-") as folder:
        certificates.make_ca(Path(folder), "benchmark")
        for process in ("sender", "receiver"):
            certificates.issue(Path(folder), process)
        modes = list(rates)
        for repeat in range(repeats):
            for mode in modes[repeat % 3 :] + modes[: repeat % 3]:
                tls = folder if mode == "tls" else None
                rates[mode].append(measure(mode, records, tls=tls)["records_per_s"])
    peak, base, tls_peak = (statistics.median(rates[mode]) for mode in ("streamlet", "raw", "tls"))
    lags = measure("streamlet", records // 2, rate=peak / 2)["lags"]
    return report(
        "tcp", peak, base, paced_rate=round(peak / 2), **latency_ms(lags), records=records, repeats=repeats,
        tls_records_per_s=round(tls_peak), tls_ratio=round(tls_peak / peak, 3),
    )  # fmt: skip


def _receive(role: str, records: int, tls: str | None) -> None:
    if role == "raw":
        result = uvloop.run(receive_raw(records))
    else:
        result = uvloop.run(receive_streamlet(records, latency=role == "latency", tls=tls))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    _receive(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
