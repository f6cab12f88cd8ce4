"""Run records -> the paper's tables: ``python -m birder_repro.report`` (``make tables``).

- ``records``: read every ``record.json`` under ``runs/`` into one flat DataFrame (one row per run);
- ``identity``: which config keys make a cell (all but the seed and those that cannot change a result);
- ``cells``: which runs a table shows (one row per configuration, seeds aggregated) and which it leaves out, why;
- ``tables``: speedup, scale efficiency and bytes per step of each row (the numbers, also the CSV files);
- ``display`` and ``documents``: the strings a reader sees, and the markdown files;
- ``paper``: the paper's own numbers (``tables/paper/*.csv``) beside the reproduced cells;
- ``target``: time to accuracy over seeds;
- ``figures``: the paper's Figures 2-4 where matplotlib is installed.
"""

from .records import flatten_record, load_frame, load_records, records_frame, runs_root
from .tables import cell_table, scale_efficiency, speedup, volume_ratio

__all__ = [
    "cell_table",
    "flatten_record",
    "load_frame",
    "load_records",
    "records_frame",
    "runs_root",
    "scale_efficiency",
    "speedup",
    "volume_ratio",
]
