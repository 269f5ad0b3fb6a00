"""Two sources into one task with two input ports in sync mode; one output port feeds two sinks.

Orders and payments arrive on separate streams; ``MatchPayments`` pairs them
by order id. In sync mode it runs only when both streams have delivered, so
neither stream races ahead of the other. Its single output port feeds two
sinks (1-to-N): every match reaches both the ledger and the audit log.

    python examples/merge_ports.py
    streamlet run examples/merge_ports.py --sort key
"""

from __future__ import annotations

import streamlet as sl

ORDERS = [("o1", 30.0), ("o2", 12.5), ("o3", 99.0), ("o4", 5.0)]
PAYMENTS = [("o2", 12.5), ("o1", 30.0), ("o4", 4.0), ("o3", 99.0)]


class MatchPayments(sl.Task):
    """Emits ``(order_id, "paid" | "mismatch")`` once an order and its payment have both arrived."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_inputs(2)
        ports.sync_inputs(True)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for port, other in ((0, 1), (1, 0)):
            for record in inputs.get(port):
                waiting = self.state.get((other, record.key))
                if waiting is None:
                    self.state.put((port, record.key), record.value)
                    continue
                self.state.delete((other, record.key))
                outputs.emit(record.key, "paid" if waiting == record.value else "mismatch")


def build_topology() -> sl.Topology:
    """orders + payments -> match (sync, 2 inputs) -> ledger and audit."""
    topology = sl.Topology("merge-ports")
    orders = topology.add_source("orders", ORDERS)
    payments = topology.add_source("payments", PAYMENTS)
    match = topology.add_task("match", MatchPayments)
    match.set_input(orders, in_port=0).set_input(payments, in_port=1)
    topology.add_sink("ledger", sl.CollectSink()).set_input(match)
    topology.add_sink("audit", sl.CollectSink()).set_input(match)
    return topology


if __name__ == "__main__":
    result = sl.run(build_topology())
    for record in sorted(result.sink("ledger"), key=lambda r: r.key):
        print(record.key, record.value)
