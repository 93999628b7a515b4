"""The Colab notebooks run end to end (nbclient, a real kernel) at small settings, and what they
print holds what their studies guarantee.

r3_tito_mismatch.ipynb: two episodes per rollout set of a random-init policy in real Docker
sandboxes. Asserted are consequences of how the study is built, not hoped-for effect sizes:
TITO never drifts and a TITO-less harness does once a turn's sampled ids are non-canonical (a
random policy's almost always are); R3 rows replay exactly the rollout's experts and score the
same trajectories as their R3-off twins; without replay the experts used are the router's own;
float32 rollout against float32 training differs only by rounding.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("neither", "TITO only", "R3 only", "TITO + R3",
            "deterministic: float32 rollout, TITO + R3")


def execute(name: str, **params) -> nbformat.NotebookNode:
    """Run colabs/<name> with the parameters cell's assignments replaced by `params`."""
    nb = nbformat.read(ROOT / "colabs" / name, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    lines = cell.source.splitlines()
    for key, value in params.items():
        at = [i for i, line in enumerate(lines) if line.startswith(f"{key} = ")]
        assert len(at) == 1, f"parameter {key} not in the parameters cell"
        lines[at[0]] = f"{key} = {value!r}"
    cell.source = "\n".join(lines)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "colabs")}}).execute()
    return nb


def printed(nb, cell_id: str) -> str:
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def parse_table(text: str) -> list[dict]:
    """mismatch_study.format_table's output: a header, a rule, then one row per setting."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("setting "))
    header = re.split(r"\s{2,}", lines[start])
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        row = dict(zip(header, re.split(r"\s{2,}", line), strict=True))
        rows.append({k: v if k in ("setting", "rollout_dtype", "tito", "r3") else float(v)
                     for k, v in row.items()})
    return rows


@pytest.mark.slow
def test_r3_tito_mismatch_notebook(docker_backend):
    nb = execute("r3_tito_mismatch.ipynb", EPISODES=2, SEED=0, SANDBOX="docker")
    rows = parse_table(printed(nb, "run"))
    assert [r["setting"] for r in rows] == list(SETTINGS)
    neither, tito, r3, both, det = rows
    for r in rows:
        for key in ("gap_mean", "gap_max", "routing_disagreement", "used_route_disagreement"):
            assert math.isfinite(r[key]) and r[key] >= 0, (r["setting"], key, r[key])
        assert r["gap_max"] >= r["gap_mean"] and r["trained_tokens"] > 0, r
    assert [(r["rollout_dtype"], r["tito"], r["r3"]) for r in rows] == [
        ("bfloat16", "False", "False"), ("bfloat16", "True", "False"),
        ("bfloat16", "False", "True"), ("bfloat16", "True", "True"),
        ("float32", "True", "True")]

    # TITO trains on the sampled ids; the text round-trip does not once they are non-canonical.
    assert tito["retokenized_drift"] == both["retokenized_drift"] == det["retokenized_drift"] == 0
    assert neither["noncanonical_turns"] > 0  # a random-init policy's ids are rarely BPE's own
    assert neither["retokenized_drift"] > 0
    # R3 changes only the training forward: each R3 row scores its R3-off twin's trajectories.
    for off, on in ((neither, r3), (tito, both)):
        for key in ("trained_tokens", "turns", "retokenized_drift", "noncanonical_turns"):
            assert off[key] == on[key], (off["setting"], on["setting"], key)
    # Replay: the forward used exactly the rollout's experts; without it, its router's own.
    assert both["used_route_disagreement"] == r3["used_route_disagreement"] == 0
    assert det["used_route_disagreement"] == 0
    assert neither["used_route_disagreement"] == neither["routing_disagreement"]
    assert tito["used_route_disagreement"] == tito["routing_disagreement"]
    # Equal precision, one model: only float32 rounding is left (the gap is a mean of
    # rounding-sized differences; a flipped expert would need a router tie within ~1e-8).
    assert det["gap_mean"] < 1e-5 and det["routing_disagreement"] == 0, det
    # ...while the bfloat16 rollout really ran in bfloat16 (8-bit mantissas move every logit).
    assert both["gap_mean"] > 10 * max(det["gap_mean"], 1e-7), (both, det)

    findings = printed(nb, "findings")
    assert "Deterministic (float32 rollout, TITO + R3)" in findings
    plot = next(c for c in nb.cells if c.get("id") == "plot")
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)
