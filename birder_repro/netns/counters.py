"""A link's kernel counters (``/sys/class/net/<iface>/statistics``) and TCP's retransmitted segments
(``/proc/net/snmp``), as seen from the namespace that reads them."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FRAME_HEADER_BYTES", "read_counters", "rx_bytes"]

FRAME_HEADER_BYTES = 66  # Ethernet 14 + IPv4 20 + TCP 20 + timestamp option 12 (Linux's default)


def read_counters(
    iface: str, sys_net: Path = Path("/sys/class/net"), snmp: Path = Path("/proc/net/snmp")
) -> dict[str, int]:
    """``tx_bytes``, ``tx_packets`` of ``iface`` and TCP's ``retrans_segs``, as seen from this namespace."""
    stats = sys_net / iface / "statistics"
    return {
        "tx_bytes": int((stats / "tx_bytes").read_text()),
        "tx_packets": int((stats / "tx_packets").read_text()),
        "retrans_segs": _tcp_retransmits(snmp),
    }


def _tcp_retransmits(snmp: Path) -> int:
    # /proc/net/snmp: a "Tcp:" line of names, then one of values (per network namespace).
    rows = [line.split() for line in snmp.read_text().splitlines() if line.startswith("Tcp:")]
    return int(dict(zip(rows[0], rows[1])).get("RetransSegs", 0)) if len(rows) >= 2 else 0


def rx_bytes(iface: str, sys_net: Path = Path("/sys/class/net")) -> int | None:
    """Bytes ``iface`` received (the bridge end of a node's veth: what the node sent), None if it is gone."""
    try:
        return int((sys_net / iface / "statistics" / "rx_bytes").read_text())
    except OSError:
        return None
