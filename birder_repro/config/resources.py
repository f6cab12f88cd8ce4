"""Where the files the package reads at run time are: ``conf/`` (the Hydra tree) and ``tables/paper/`` (the
paper's numbers).

Both sit at the top of the repository. A checkout (or an editable install) reads them there; a wheel installs
them as the packages ``birder_repro.conf`` and ``birder_repro.paper_tables`` (pyproject.toml's package-dir maps
the top-level folders onto them, as it maps tasks/ onto birder_repro.tasks), found here through the import
system, so an installed ``birder-repro`` works anywhere.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["REPO", "CONF_PACKAGE", "PAPER_TABLES_PACKAGE", "conf_dir", "paper_tables_dir"]

REPO = Path(__file__).resolve().parent.parent  # the checkout, when the package runs from one
CONF_PACKAGE = "birder_repro.conf"
PAPER_TABLES_PACKAGE = "birder_repro.paper_tables"


def conf_dir() -> Path | None:
    """The config tree: the checkout's conf/, else the installed package's copy, else None."""
    return _top_level_or_packaged(REPO / "conf", CONF_PACKAGE, "config.yaml")


def paper_tables_dir() -> Path:
    """tables/paper: the checkout's, else the installed copy, else tables/paper of the working directory."""
    return _top_level_or_packaged(REPO / "tables" / "paper", PAPER_TABLES_PACKAGE) or Path("tables") / "paper"


def _top_level_or_packaged(checkout: Path, package: str, marker: str = "") -> Path | None:
    """``checkout`` where it is there (holding ``marker``), else the folder of the installed ``package``."""
    if (checkout / marker).exists():
        return checkout
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # no birder_repro at all: cannot happen from inside it, but keep None
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / marker).exists():
            return Path(location)
    return None
