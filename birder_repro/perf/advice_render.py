"""What ``mode=advise`` prints and writes: the advice dict (birder_repro.perf.advisor.advise) as text, as
``advice.json`` and as a figure. Every number is shown with its source: measured, from the paper, or predicted;
what is not known is shown as what to measure, with the command and its expected time."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from birder_repro.run.summary import fmt_number  # the one number format (link rates, times, steps)
from birder_repro.styles import optim_style

__all__ = ["ADVICE_FILE", "fmt_number", "format_advice", "write_advice", "advice_figure"]

ADVICE_FILE = "advice.json"


def model_text(model: Mapping[str, Any] | None) -> str:
    """``size=full, width=512``: the query's model, its null keys left out."""
    if not model:
        return "(any)"
    return ", ".join(f"{k}={v}" for k, v in sorted(model.items()) if v is not None and not isinstance(v, Mapping))


def format_advice(advice: Mapping[str, Any]) -> str:
    """The header, the ranked table, where the ranking changes with the link, every method with what it lacks,
    and the commands that measure it with their expected times."""
    lay = advice["layout"]
    lines = [
        f"advice: {advice['task']} (model {model_text(advice.get('model'))}) to "
        f"{advice['target'] or '(no target set or measured)'} on {lay['nodes']} nodes x {lay['gpus_per_node']} "
        f"GPUs, cluster {lay['cluster']}, link {fmt_number(lay['link_mbit'])} Mbit/s, global batch "
        f"{lay['global_batch']}",
    ]
    lines += [f"  note: {n}" for n in advice.get("notes", [])]
    if advice["ranked"]:
        lines += ["", _table(advice["ranked"]), ""]
        lines += [
            f"  {r['method']}: steps {r['steps_source']}; {_profile_text(r['profile'])}" for r in advice["ranked"]
        ]
        if any(r["ranked_after_reliable"] for r in advice["ranked"]):
            lines.append(
                "  (a method some of whose runs did not reach the target ranks after those all of whose did; "
                "from the paper: its run ended short of the target, or the paper reports no score on your target's "
                "metric, its time is to the end of the paper's schedule)"
            )
        lines += ["", *_bands_text(advice)]
    unranked = [m for m in advice.get("methods", []) if not m["ranked"]]
    if unranked:
        lines.append("")
    for m in unranked:  # every method stays in the answer, with what it lacks
        has = [f"profile {m['profile']} ({m['profile_name']})"] if m["profile_name"] else []
        lines.append(f"cannot rank {m['method']}: " + "; ".join(m["lacks"] + has))
    for c in advice.get("commands", []):
        lines.append(f"  to measure it ({c['what']}, for {', '.join(c['methods'])}): {c['command']}")
        lines.append(f"    expected time: {c['expected']}")
    return "\n".join(lines)


def _profile_text(p: Mapping[str, Any]) -> str:
    mine = "" if p["source"] in ("yours", "given") else f" ({p['device']}), no 1-node profile of yours"
    return f"profile {p['source']}: {p['name']}{mine}"


def _steps_cell(s: Mapping[str, Any]) -> str:
    if s["source"] == "from the paper":
        if s.get("ended_at") is None:  # the paper reports no score on the target's metric: its schedule's length
            return f"{fmt_number(s['value'])} (from the paper, {s['table']}: its schedule; target not reported there)"
        verdict = "reached by its end" if s["reached"] else "target not reached there"
        return f"<= {fmt_number(s['value'])} (from the paper, {s['table']}: {verdict})"
    return (
        f"{fmt_number(s['value'])} (measured, {s['reached']} of {s['runs']} reached, "
        f"seeds {','.join(map(str, s['seeds']))})"
    )


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The ranked methods as a Markdown table, every number marked measured, from the paper or predicted."""
    header = ["#", "method", "steps to target", "step time", "time to target", "x #1's time"]
    shown = []
    for r in rows:
        step = f"{1e3 * r['step_s']['value']:.2f} ms (predicted)"
        if r["freeze"]:
            step += f"; first {r['freeze']} at {1e3 * r['warmup_step_s']['value']:.2f} ms (fp32, predicted)"
        paper = r["steps"]["source"] == "from the paper"
        time = f"{fmt_number(r['time_to_target_s']['value'], 3)} s (predicted)"
        if paper:
            time = "<= " + time if r["steps"]["reached"] else time + " to the schedule's end"
        shown.append(
            [
                str(r["rank"]),
                r["method"] + (" (not every run reached)" if r["ranked_after_reliable"] and not paper else ""),
                _steps_cell(r["steps"]),
                step,
                time,
                f"{r['slower_than_best']:.2f}x",
            ]
        )
    return tabulate(shown, headers=header, tablefmt="pipe", disable_numparse=True)


def _bands_text(advice: Mapping[str, Any]) -> list[str]:
    links = advice["links"]
    if len(advice["ranked"]) < 2:  # one method: nothing to compare, at any link
        return ["one method ranked: no comparison over link rates until another has its steps and a profile"]
    lines = [f"the ranking over {fmt_number(links[0])} to {fmt_number(links[-1])} Mbit/s (predicted):"]
    for b in advice["bands"]:
        lines.append(f"  {fmt_number(b['from'], 3)} - {fmt_number(b['to'], 3)} Mbit/s: " + " < ".join(b["order"]))
    if not advice["winner_changes"]:
        lines.append(f"  the fastest of these {len(advice['ranked'])} methods is the same at every link rate")
    for w in advice["winner_changes"]:
        lines.append(
            f"  the winner changes at about {fmt_number(w['link'], 3)} Mbit/s: {w['below']} below, {w['above']} above"
        )
    return lines


def write_advice(advice: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """advice.json and the figure ``advise_<task>.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ADVICE_FILE
    path.write_text(json.dumps(advice, indent=2, default=str) + "\n")
    written = [path]
    if advice["ranked"]:
        written.append(advice_figure(advice, out_dir / f"advise_{advice['task']}.png"))
    return written


def advice_figure(advice: Mapping[str, Any], path: Path) -> Path:
    """Predicted time to target against the link rate, one line per ranked method in its colour and line style
    of every figure (birder_repro.styles), faded where not every run reached the target, log-log; the user's link
    as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes or CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for r in advice["ranked"]:
        after = r["ranked_after_reliable"]  # faded: not every run reached the target
        label = r["method"] + (f" ({r['steps']['reached']} of {r['steps']['runs']} reached)" if after else "")
        ax.plot(
            advice["links"],
            advice["curves"][r["method"]],
            label=label,
            linewidth=1.4,
            alpha=0.5 if after else 1.0,
            **optim_style(r["method"]),  # the method's colour and line style in every figure of the report
        )
    link = advice["layout"]["link_mbit"]
    ax.axvline(link, color="0.3", linewidth=0.9, linestyle=":")
    ax.text(link, 1.0, f" your link: {fmt_number(link)} Mbit/s", transform=ax.get_xaxis_transform(), va="top")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("inter-node link, Mbit/s")
    ax.set_ylabel("predicted time to target, s")
    lay = advice["layout"]
    ax.set_title(f"{advice['task']}: {lay['nodes']} x {lay['gpus_per_node']}, to {advice['target']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
