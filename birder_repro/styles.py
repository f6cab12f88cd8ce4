"""One colour and one line style per optimizer, the same in every figure: the report's (birder_repro.report) and
the advisor's (birder_repro.perf.advice_render). A leaf, so that both may import it."""

from __future__ import annotations

__all__ = ["COLOURS", "LINESTYLES", "STYLE_ORDER", "optim_style"]

# One colour and one line style per optimizer, in STYLE_ORDER (15 optimizers; matplotlib's default cycle
# has 10 colours, which gave SGDM and Birder the same blue); names and variants beyond it take the next pairs.
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#000000",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2, 2, 2)))


# The order styles are handed out in: the tables' order (birder_repro.report.display.OPTIM_ORDER) as it was
# when each name was added, new names at the end, so that adding an optimizer to the tables' order never
# changes another one's colour (Birder: black).
STYLE_ORDER = (
    "sgdm",
    "bertadam",
    "sgd",
    "adamw",
    "softsignsgd",
    "sgdm_fp16",
    "sgdm_powersgd",
    "adamw_powersgd",
    "onebit_adam",
    "onebit_lamb",
    "birder",
    "onebit_adam_precond",
    "sgdm_2level",
    "sgdm_bf16_2level",
    "diloco",
    "diloco_1bit",
    "streaming_diloco",
)


def optim_style(optim: str, variant: str = "") -> dict:
    """The colour and line style of an optimizer (and Birder variant) in every figure: distinct pairs for the
    optimizers of the tables' order (birder_repro.report.display.OPTIM_ORDER), then for other names by a stable
    index of the name."""
    index = (
        STYLE_ORDER.index(optim)
        if optim in STYLE_ORDER and not variant
        else len(STYLE_ORDER) + sum(map(ord, f"{optim}/{variant}")) % max(len(COLOURS) - len(STYLE_ORDER), 1)
    )
    return {"color": COLOURS[index % len(COLOURS)], "linestyle": LINESTYLES[index % len(LINESTYLES)]}
