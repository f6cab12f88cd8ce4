"""One line before numba compiles the ``cpu`` kernels: the first Birder run on a machine spends about a minute
there, and said nothing.

numba compiles a ``cache=True`` function at its first call in a process unless its on-disk cache (an index file
beside the module's ``__pycache__``, keyed by numba's version and the source file's stamp) holds it.
:func:`cache_cold` reads that index through numba's own cache object; where it cannot (numba's caching layout is
its own, and may change), whether the kernels will compile is unknown, and the line is said once per process on
rank 0 anyway.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

__all__ = ["COMPILING_LINE", "cache_cold", "announce"]

COMPILING_LINE = "compiling Birder's CPU kernels (once, cached): about a minute"
_said = False  # once per process
_checked: list[Any] = []  # the kernels already looked up in the cache (each compiles at its own first call)


def cache_cold(dispatchers: Iterable[Any]) -> bool | None:
    """Whether calling ``dispatchers`` (numba ``@njit(cache=True)`` functions) will compile one: True where one
    has no machine code in this process and no fresh entry in its on-disk cache; None where numba's cache cannot
    be read."""
    try:
        return any(not d.signatures and not d._cache._cache_file._load_index() for d in dispatchers)
    except Exception:  # noqa: BLE001 - numba's private layout changed: unknown, not an error
        return None


def announce(dispatchers: Iterable[Any], env: Mapping[str, str] = os.environ, out: TextIO | None = None) -> bool:
    """Say :data:`COMPILING_LINE` (on ``out``, stderr by default) before the first call of ``dispatchers`` in this
    process, on rank 0 only (``RANK``; a process started alone is rank 0), where the cache of one not looked up
    before is cold or cannot be read; at most once per process. Return whether it was said."""
    global _said
    new = [d for d in dispatchers if not any(d is seen for seen in _checked)]
    _checked.extend(new)
    if _said or not new or env.get("RANK", "0") not in ("", "0") or cache_cold(new) is False:
        return False
    _said = True
    print(f"[birder-repro] {COMPILING_LINE}", file=out or sys.stderr, flush=True)
    return True
