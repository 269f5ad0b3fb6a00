"""Constants shared by the topology model and the runtime."""

from __future__ import annotations

from typing import Final

LATE: Final = -1  #: ``set_input(task, out_port=LATE)``: a task's late side output (records after their window closed)
SHED: Final = -2  #: ``set_input(source, out_port=SHED)``: a source's shed records (load shedding under a QoS)
