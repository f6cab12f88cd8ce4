"""Communication: topology, 1-bit packing, and the DDP communication hooks with their states.

Every scheme is attached with ``attach_<scheme>(ddp_model, optimizer, ...)`` and returns a state that
subclasses :class:`CommStats` (bytes sent intra- and inter-node, compression and communication seconds) and
has ``state_dict()`` / ``load_state_dict()``. :func:`attach_comm` picks the scheme an optimizer is
registered with.
"""

from birder_repro.comm.accounting import CommStats
from birder_repro.comm.topology import Topology, build_topology, flat_topology

__all__ = ["CommStats", "Topology", "build_topology", "flat_topology"]
