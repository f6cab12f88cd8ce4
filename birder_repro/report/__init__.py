"""Run records -> the paper's tables: ``python -m birder_repro.report`` (``make tables``).

- ``records``: read every ``record.json`` under ``runs/`` into one flat DataFrame (one row per run);
- ``tables``: one row per (cell, optimizer) with speedup, scale efficiency and bytes per step; markdown,
  CSV and LaTeX writers;
- ``paper``: the paper's own numbers (``tables/paper/*.csv``) beside the reproduced cells;
- ``figures``: throughput against #GPUs where matplotlib is installed.
"""

from .records import flatten_record, load_frame, load_records, records_frame, runs_root
from .tables import cell_table, scale_efficiency, speedup, volume_ratio

__all__ = ["cell_table", "flatten_record", "load_frame", "load_records", "records_frame", "runs_root",
           "scale_efficiency", "speedup", "volume_ratio"]
