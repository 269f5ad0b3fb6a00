"""Job modules with loops, as text: the unit and the real-cluster tests load the same one."""

# numbers halved round a loop until they reach 1; each leaves with the rounds it took, at most 10 (2048.. dropped)
HALVING = """
import streamlet as sl

class Halve(sl.Task):
    def declare_ports(self, ports):
        ports.set_outputs(2)

    def execute(self, inputs, outputs):
        for record in inputs.get():
            if record.value <= 1:
                outputs.emit(record.key, record.iteration, port=1, ts=record.ts)
            else:
                outputs.emit(record.key, record.value // 2, port=0, ts=record.ts)

def build_topology():
    topology = sl.Topology("halving")
    source = topology.add_source("numbers", [sl.Record(str(n), n, float(n)) for n in range(1, 3001)])
    halve = topology.add_task("halve", Halve, parallelism=2)
    halve.set_input(source).set_input(halve, out_port=0, partitioning=sl.SAME_KEY)
    topology.add_sink("done", sl.CollectSink()).set_input(halve, out_port=1)
    topology.set_max_iterations(10)
    return topology
"""
