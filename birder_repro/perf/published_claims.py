"""The speedups the 1-bit papers claim (published_claims.csv) in ``make validate-published`` (perf.published):
each predicted on its paper's probed V100 cluster, or checked against its own formula's bound (APMSqueeze)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .published_protocol import TARGETS
from .published_protocol import relative_error as _err
from .published_v100 import BERT_LARGE_PARAMS, load_v100_rows, v100_predict
from .schemes import bucket_collectives, counted_bytes
from .validate_rows import PAPER_DIR

__all__ = ["load_claims", "claims_frame", "stage_speedup", "end_to_end"]


def load_claims(paper_dir: Path = PAPER_DIR) -> pd.DataFrame:
    return pd.read_csv(paper_dir / "published_claims.csv")


def _stage_speedup(claim: pd.Series) -> float:
    """The compression stage's speedup a claim states or implies: an end-to-end one e with warmup ratio w is
    1 / (w + (1 - w) / s) (both 1-bit papers' formula), so s = (1 - w) / (1 / e - w); inf where e >= 1 / w."""
    if claim["kind"] == "compression_stage":
        return float(claim["value"])
    w, e = float(claim["warmup_ratio"]), float(claim["value"])
    return math.inf if 1 / e <= w else (1 - w) / (1 / e - w)


def _end_to_end(stage: float, w: float) -> float:
    return 1.0 / (w + (1 - w) / stage)


def _exchange_node_bytes(n: int, m: int) -> float:
    """Bytes one node's link sends in a step of the 1-bit exchange of the fp16 model's signs (all its GPUs')."""
    ops = bucket_collectives("onebit", BERT_LARGE_PARAMS, n, m)
    return m * sum(counted_bytes(op, n, m)[1] for op in ops)


def claims_frame(v100_fits: dict[str, dict], paper_dir: Path = PAPER_DIR) -> pd.DataFrame:
    out = []
    claims = load_claims(paper_dir)
    rows = load_v100_rows(paper_dir)
    for _, c in claims.iterrows():
        base = {"claim": c["claim"], "paper": c["paper"], "where": c["where"], "kind": c["kind"], "claimed": c["value"]}
        group = f"{c['paper']}/{c['cluster']}"
        if group not in v100_fits:
            out.append({**base, **_apmsqueeze_check(c)})
            continue
        f = v100_fits[group]
        row = rows[(rows["group"] == group) & (rows["nodes"] == c["nodes"]) & (rows["batch"] == c["batch"])].iloc[0]
        baseline = v100_predict(f["profile"], f["spec"], row, "fp16")
        onebit = v100_predict(f["profile"], f["spec"], row, "onebit")
        stage = baseline["step_s"] / onebit["step_s"]
        predicted = stage if c["kind"] == "compression_stage" else _end_to_end(stage, float(c["warmup_ratio"]))
        error = _err(predicted, float(c["value"]))
        need = ""
        if abs(error) > TARGETS["claim"]:
            wanted = _stage_speedup(c)
            rest = onebit["step_s"] - onebit["exchange_s"]
            exchange = baseline["step_s"] / wanted - rest
            n, m = int(row["nodes"]), int(row["gpus_per_node"])
            measured_rate = f["fit"].bytes_per_s * 8 / 1e9
            if exchange > 0:
                rate = _exchange_node_bytes(n, m) * 8 / exchange / 1e9
                need = (
                    f"the exchange would have had to take {1e3 * exchange:.0f} ms (predicted "
                    f"{1e3 * onebit['exchange_s']:.0f}): {rate:.1f} Gbit/s a node, {rate / measured_rate:.2f}x the "
                    f"all-reduce's measured {measured_rate:.2f}"
                )
            else:
                free = baseline["step_s"] / rest
                bound = free if c["kind"] == "compression_stage" else _end_to_end(free, float(c["warmup_ratio"]))
                need = (
                    f"not reachable even with a free exchange: the rest of the 1-bit step ({1e3 * rest:.0f} ms: "
                    f"compute, optimizer, its collectives) bounds it at {bound:.2f}x"
                )
        out.append({**base, "predicted": predicted, "error": error, "status": "predicted", "need": need})
    return pd.DataFrame(out)


def _apmsqueeze_check(c: pd.Series) -> dict:
    """APMSqueeze's text gives no 1-node row and no probe of its cluster: nothing to predict from. Its end-to-end
    claims are checked against its own formula's bound instead: with a share w of the run uncompressed, no
    compression stage gives more than 1 / w end to end."""
    if c["kind"] != "end_to_end":
        return {"predicted": math.nan, "error": math.nan, "status": "not predicted", "need": "no 1-node row, no probe"}
    bound = 1 / float(c["warmup_ratio"])
    ok = float(c["value"]) <= bound
    need = f"within the bound 1/w = {bound:.2f}" if ok else f"ABOVE the bound 1/w = {bound:.2f} of any compression"
    return {"predicted": math.nan, "error": math.nan, "status": "not predicted", "need": need}


stage_speedup, end_to_end = _stage_speedup, _end_to_end
