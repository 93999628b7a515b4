"""colabs/trajectories.ipynb runs end to end (nbclient, a real kernel) on a toy main-job run, and
what it prints matches the run's files: the eval labels and their trial counts are summary.json's,
the loss-mask numbers of the sample it renders are that .npz file's, and its loss-mask check
covers every sample of the run. Run again on a copy with one sample's mask moved onto a prompt
token, the notebook's own check stops it.
"""

from __future__ import annotations

import ast
import json
import re
import shutil

import nbformat
import numpy as np
import pytest
from nbclient.exceptions import CellExecutionError

from conftest import TOY_RECIPE
from t1jax.rollout.evaluate import read_trials
from t1jax.rollout.sample import Sample
from test_colabs import ROOT, execute, printed


def table(text: str, first_column: str) -> list[dict]:
    """The first fixed-width table (trajectory_browser.format_table) whose header starts with
    first_column: a header, a rule, rows until a blank or '...' line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("..."):
            break
        rows.append(dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


def mask_runs(mask) -> list[int]:
    """Lengths of the runs of 1s, recomputed here from the raw array."""
    lengths, current = [], 0
    for bit in list(mask) + [0]:
        if bit:
            current += 1
        elif current:
            lengths.append(current)
            current = 0
    return lengths


@pytest.mark.slow
def test_trajectories_notebook(toy_run, tmp_path):
    nb = execute("trajectories.ipynb", RUN=str(toy_run), LABEL="ppo", MAX_ROWS=100)
    summaries = {p.parent.name: json.loads(p.read_text())
                 for p in (toy_run / "eval").glob("*/summary.json")}
    assert {"base", "sft", "ppo"} <= set(summaries)

    # Eval labels and their counts are the run's.
    overview = {r["label"]: r for r in table(printed(nb, "load"), "label")}
    assert set(overview) == set(summaries)
    for label, summary in summaries.items():
        records = [t for t in read_trials(toy_run / "eval" / label / "trials.jsonl")
                   if t["status"] == "done"]
        assert int(overview[label]["trials"]) == summary["trials"] == len(records) > 0, label
        assert int(overview[label]["records"]) == len(records), label
        assert int(overview[label]["tasks"]) == summary["tasks"], label

    # The browse table lists every ppo trial with its record's reward and outcome.
    browse = printed(nb, "browse")
    ppo = summaries["ppo"]
    assert browse.startswith(f"ppo: {ppo['trials']} trials of {ppo['tasks']} tasks")
    rows = table(browse, "task_id")
    records = {(t["task_id"], t["attempt"]): t
               for t in read_trials(toy_run / "eval" / "ppo" / "trials.jsonl")}
    assert len(rows) == ppo["trials"]
    for row in rows:
        record = records[(row["task_id"], int(row["attempt"]))]
        assert float(row["reward"]) == pytest.approx(record["reward"], abs=5e-3)
        assert row["resolved"] == str(record["resolved"])
        assert row["failure_mode"] == record["failure_mode"]
    per_task = table(browse.split("per task")[1], "task_id")
    assert {r["task_id"] for r in per_task} == {t for t, _ in records}

    # The detail view shows a real trial: its instruction and its verifier line.
    detail = printed(nb, "detail")
    first = re.match(r"(\S+) attempt (\d+) \(ppo\)", detail)
    record = records[(first[1], int(first[2]))]
    assert record["instruction"] in detail
    assert f"VERIFIER: {record['passed']}/{record['total']} assertions passed" in detail

    # The loss-mask numbers are the rendered sample's, recomputed from its .npz.
    mask_out = printed(nb, "mask")
    path = toy_run / re.search(r"^sample: (\S+)$", mask_out, re.M)[1]
    with np.load(path) as npz:
        tokens, loss_mask = npz["tokens"], npz["loss_mask"]
    counts = re.search(r"^tokens: (\d+), trained: (\d+) \(", mask_out, re.M)
    assert int(counts[1]) == len(tokens)
    assert int(counts[2]) == int(loss_mask.sum()) > 0
    turns = table(mask_out, "turn")
    assert [int(r["trained"]) for r in turns] == mask_runs(loss_mask)
    assert mask_out.count("[[") >= len(turns) and "]]" in mask_out
    html_out = next(o for c in nb.cells if c.get("id") == "mask" for o in c.outputs
                    if "text/html" in o.get("data", {}))["data"]["text/html"]
    assert "&lt;|im_start|&gt;" in html_out and "<|im_start|>" not in html_out  # escaped

    # The check covers every sample the run wrote, and passed.
    check = printed(nb, "mask_check")
    n_files = len(list(toy_run.glob("eval/*/samples/*.npz"))) \
        + len(list(toy_run.glob("*/rollouts/step_*/*.npz")))
    assert n_files > sum(s["trials"] for s in summaries.values())  # training samples too
    assert f"loss-mask check passed on all {n_files} samples" in check
    for label, summary in summaries.items():
        assert f"{label}: {summary['trials']} samples" in check

    plot = next(c for c in nb.cells if c.get("id") == "plot")
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)
    findings = printed(nb, "findings")
    resolved = sum(bool(t["resolved"]) for t in records.values() if t["status"] == "done")
    assert f"- ppo: {resolved} of {ppo['trials']} trials resolved" in findings
    assert "The check found 0 problems" in findings

    # Colab's toy run uses the toy settings the tests use.
    load = next(c for c in nb.cells if c.get("id") == "load").source
    assign = next(n for n in ast.parse(load).body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "TOY_RECIPE")
    assert ast.literal_eval(assign.value) == TOY_RECIPE

    # A mask moved onto a prompt token stops the notebook at its own check.
    broken = tmp_path / "broken_run"
    shutil.copytree(toy_run, broken, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    victim = sorted((broken / "eval" / "sft" / "samples").glob("*.npz"))[0]
    sample = Sample.from_npz(victim)
    sample.loss_mask[sample.metadata["prompt_len"] - 1] = 1
    sample.to_npz(victim)
    with pytest.raises(CellExecutionError, match="the loss mask is not exactly on the sampled"):
        execute("trajectories.ipynb", RUN=str(broken))


def test_notebook_cells_have_ids_and_parameters():
    """The cells the tests read exist with stable ids; the notebook is committed with outputs."""
    nb = nbformat.read(ROOT / "colabs" / "trajectories.ipynb", as_version=4)
    ids = [c.get("id") for c in nb.cells]
    for cell_id in ("parameters", "setup", "load", "browse", "detail", "mask", "mask_check",
                    "plot", "findings", "conclusions"):
        assert cell_id in ids, cell_id
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert params.get("id") == "parameters"
    assert 'RUN = "runs/tiny_cpu"' in params.source
    assert nb.cells[-1].cell_type == "markdown" and "What we found" in nb.cells[-1].source
    assert printed(nb, "findings").strip(), "commit the notebook executed at its defaults"
