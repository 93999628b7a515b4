"""A run's trials as tables, one trial as text, and its tokens with the loss mask made visible.

Why: researchers reading a run want to sort and filter trials in a notebook, read one
trajectory the way the model saw it, and see which tokens the policy gradient touched. The eval
sets leave trial records (``eval/<label>/trials.jsonl``) plus the trained samples
(``samples/*.npz``); the training rollouts (``<stage>/rollouts/step_*/*.npz``) leave samples
only. Both become the same trial dicts here, read with the project's own readers
(``t1jax.rollout.evaluate``, ``t1jax.rollout.sample``), and ``check_loss_mask`` verifies from the tokens
alone that the loss mask covers exactly the model's sampled replies.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from t1jax.rollout.eval_summary import failure_mode
from t1jax.rollout.evaluate import mask_runs, sample_name, segments
from t1jax.rollout.chat import IM_END
from t1jax.rollout.sample import Sample
from t1jax.rollout.tito import assistant_header_ids
from t1jax.tasks.task import load_task

ROLLOUT_SETS = ("warmup/rollouts", "ppo/rollouts")  # labels that name training samples
TRIAL_COLUMNS = ("task_id", "attempt", "category", "turns", "reward", "resolved",
                 "failure_mode", "finish", "tokens", "sampled_tokens")


# -- reading -------------------------------------------------------------------------------------

def eval_overview(run: dict) -> list[dict]:
    """One row per eval label of ``t1jax.report.summary.load_run(workdir)``, from its summary."""
    rows = []
    for label, data in run["evals"].items():
        s = data["summary"]
        rows.append({"label": label, "tasks": s.get("tasks"), "trials": s.get("trials"),
                     "records": len(data["trials"]), "resolved_rate": s.get("resolved_rate"),
                     "avg_reward": s.get("avg_reward"), "turns_mean": s.get("turns_mean"),
                     "tokens_mean": s.get("tokens_mean")})
    return rows


def rollout_trials(workdir, label: str, tokenizer) -> list[dict]:
    """Trial dicts for the training samples under ``workdir/label/step_*/``: the sample holds
    the tokens, mask and verifier report but no commands, so the conversation's observations
    are the only record of what ran. Category and instruction come from the run's task pool."""
    workdir, out, tasks = Path(workdir), [], {}
    for path in sorted((workdir / label).glob("step_*/*.npz")):
        sample = Sample.from_npz(path)
        meta, report = sample.metadata, sample.metadata.get("verifier") or {}
        task_id = meta["task_id"]
        if task_id not in tasks:
            task_dir = next((d for d in (workdir / "pool" / "train" / task_id,
                                         workdir / "pool" / "heldout" / task_id)
                             if (d / "task.toml").is_file()), None)
            tasks[task_id] = load_task(task_dir) if task_dir else None
        task = tasks[task_id]
        # older reports lack them: VerifierReport.failed's rule, and every failure then
        # counted as the agent's (training kept none of ours)
        failed = bool(report.get("failed", report.get("error") and not (
            report.get("assertions") or report.get("tampered"))))
        verdict = SimpleNamespace(solved=bool(report.get("solved")),
                                  tampered=bool(report.get("tampered")),
                                  error=report.get("error"),
                                  assertions=report.get("assertions") or [], failed=failed,
                                  blame=report.get("blame", "agent" if failed else None))
        out.append({
            "label": label, "step": int(path.parent.name.split("_")[-1]), "task_id": task_id,
            "attempt": meta["attempt"], "category": task.category if task else "",
            "instruction": task.instruction if task else "", "status": "done",
            "turns": meta["turns"], "tool_calls": meta.get("tool_calls"),
            "reward": sample.reward, "resolved": verdict.solved and not verdict.tampered,
            "passed": report.get("passed"), "total": report.get("total"),
            "finish": meta.get("finish", ""),
            "failure_mode": failure_mode(meta.get("finish", ""), verdict if report else None),
            "tokens": len(sample.tokens), "sampled_tokens": None,  # not recorded apart
            "segments": segments(sample.tokens, sample.loss_mask, tokenizer), "commands": [],
            "assertions": report.get("assertions") or [], "sample_path": str(path)})
    return out


def trials_of(workdir, label: str, run: dict, tokenizer) -> list[dict]:
    """The trials of an eval label (with ``sample_path``) or of a training rollout set."""
    if label in ROLLOUT_SETS:
        return rollout_trials(workdir, label, tokenizer)
    if label not in run["evals"]:
        raise KeyError(f"no eval/{label}/ in {workdir}; labels here: {list(run['evals'])} "
                       f"(or a training rollout set: {list(ROLLOUT_SETS)})")
    samples = Path(workdir) / "eval" / label / "samples"
    return [dict(t, sample_path=str(samples / sample_name(t["task_id"], t["attempt"])))
            for t in run["evals"][label]["trials"] if t.get("status", "done") == "done"]


# -- tables --------------------------------------------------------------------------------------

def trial_table(trials: list[dict]) -> list[dict]:
    """The browsing columns, sorted by task then attempt (``step`` too for training samples)."""
    columns = (("step",) if any("step" in t for t in trials) else ()) + TRIAL_COLUMNS
    rows = [{c: t.get(c) for c in columns} for t in trials]
    return sorted(rows, key=lambda r: (r["task_id"], r.get("step") or 0, r["attempt"]))


def task_table(trials: list[dict]) -> list[dict]:
    """Per task, over its attempts: the numbers T1 averages (resolved rate, mean reward) and
    mean turns, sorted by resolved rate then reward, best first."""
    by_task = defaultdict(list)
    for t in trials:
        by_task[t["task_id"]].append(t)
    rows = [{"task_id": task, "category": ts[0].get("category"), "attempts": len(ts),
             "turns_mean": float(np.mean([t["turns"] for t in ts])),
             "reward_mean": float(np.mean([t["reward"] for t in ts])),
             "resolved_rate": float(np.mean([bool(t["resolved"]) for t in ts]))}
            for task, ts in by_task.items()]
    return sorted(rows, key=lambda r: (-r["resolved_rate"], -r["reward_mean"], r["task_id"]))


def format_table(rows: list[dict], max_rows: int | None = None) -> str:
    """Fixed-width text (columns split by two or more spaces); floats to 3 significant
    digits. A trailing line says how many rows were left out."""
    if not rows:
        return "(no rows)"
    shown = rows[:max_rows] if max_rows else rows

    def cell(v) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.3g}"
        return "-" if v is None or v == "" else str(v)

    columns = list(rows[0])
    cells = [[cell(r.get(c)) for c in columns] for r in shown]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more rows")
    return "\n".join(lines)


# -- one trajectory ------------------------------------------------------------------------------

def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else f"{text[:n]}... [{len(text) - n} more chars]"


def conversation_text(trial: dict, max_chars: int = 600) -> str:
    """The trial as a person reads it: instruction; per model turn its text (the trained
    part), then the commands it ran with their output, or, where none were recorded (a reply
    that was not a valid tool call, or a training sample), the observation that came back;
    then the verifier's assertions and the reward."""
    turns = f"{trial['turns']} turn" + ("" if trial["turns"] == 1 else "s")
    lines = [f"{trial['task_id']} attempt {trial['attempt']} ({trial.get('label')}): {turns}, "
             f"finish {trial.get('finish') or '-'}, {trial.get('failure_mode')}", "",
             "INSTRUCTION", trial.get("instruction") or "-"]
    segs, commands = trial.get("segments") or [], trial.get("commands") or []
    turn = -1
    for i, seg in enumerate(segs):
        if not seg["trained"]:
            continue
        turn += 1
        lines += ["", f"TURN {turn}: model (trained)", _clip(seg["text"], max_chars)]
        ran = [c for c in commands if c.get("turn") == turn]
        for c in ran:
            status = "timed out" if c.get("timed_out") else f"exit {c.get('exit_code')}"
            lines += [f"  $ {c['command']}   [{status}]"]
            lines += ["    " + line for line in _clip(c.get("output") or "", max_chars)
                      .splitlines()]
        if not ran and i + 1 < len(segs):
            lines += ["  observation (not trained):", "    " + _clip(
                segs[i + 1]["text"].strip(), max_chars).replace("\n", "\n    ")]
    assertions = trial.get("assertions") or []
    lines += ["", f"VERIFIER: {trial.get('passed')}/{trial.get('total')} assertions passed, "
                  f"reward {trial['reward']:.3g}, "
                  f"{'resolved' if trial.get('resolved') else 'not resolved'}"]
    lines += [f"  {a.get('status', '?'):7s} {a.get('name')}" for a in assertions]
    return "\n".join(lines)


# -- the loss mask -------------------------------------------------------------------------------

def mask_counts(sample: Sample) -> dict:
    """Total and trained tokens, and per model turn: the context before it (prompt or
    observation) and the trained reply."""
    turns, context = [], 0
    for start, end, trained in mask_runs(sample.loss_mask):
        if trained:
            turns.append({"turn": len(turns), "start": start, "context_before": context,
                          "trained": end - start})
        else:
            context = end - start
    total, trained = len(sample.tokens), int(np.sum(sample.loss_mask))
    return {"tokens": total, "trained": trained, "fraction": trained / total if total else 0.0,
            "turns": turns}


def mask_text(sample: Sample, tokenizer, max_tokens: int = 1000) -> str:
    """The decoded sequence with each trained run wrapped in [[ ]] (first max_tokens)."""
    n = min(max_tokens, len(sample.tokens))
    parts = [f"[[{s['text']}]]" if s["trained"] else s["text"]
             for s in segments(sample.tokens[:n], sample.loss_mask[:n], tokenizer)]
    cut = len(sample.tokens) - n
    return "".join(parts) + (f"\n... [{cut} more tokens]" if cut else "")


def mask_html(sample: Sample, tokenizer, max_tokens: int = 1000) -> str:
    """The same as HTML: trained runs on green. Model output is untrusted, so every string is
    escaped and nothing from the data becomes markup."""
    n = min(max_tokens, len(sample.tokens))
    spans = []
    for s in segments(sample.tokens[:n], sample.loss_mask[:n], tokenizer):
        text = html.escape(s["text"], quote=True)
        spans.append(f'<span style="background:#c8ecd2;outline:1px solid #2f9e4f">{text}</span>'
                     if s["trained"] else f'<span style="color:#555">{text}</span>')
    cut = len(sample.tokens) - n
    return ('<pre style="white-space:pre-wrap;font-size:12px;line-height:1.5">'
            + "".join(spans) + (f"\n... [{cut} more tokens]" if cut else "") + "</pre>")


def check_loss_mask(sample: Sample, tokenizer, sampled_tokens: int | None = None) -> list[str]:
    """What is wrong with the sample's loss mask ([] if nothing): it must be on exactly the ids
    the model sampled (t1jax.rollout.tito: sampled ids mask 1, prompt, observations and
    template glue mask 0). Checked from the tokens, not the builder's bookkeeping:

    - the prompt (system + instruction, ``metadata["prompt_len"]`` tokens) is untrained;
    - every trained run starts right after the assistant header ``<|im_start|>assistant\\n``
      (so it is assistant text) and ends its turn: its last token is ``<|im_end|>``, or the
      next is the ``<|im_end|>`` the template adds to a reply cut at max tokens, or a chunk ends;
    - every assistant header is followed by a trained run (no model reply left untrained),
      except in the prompt of a later chunk, which may replay earlier replies as context
      (t1jax.rollout.context: they were trained in the chunk that sampled them);
    - no untrained token carries a sampling log-prob;
    - the trained tokens number ``sampled_tokens`` (the agent loop's own count, in an eval
      trial's record) when given.
    """
    tokens, mask = [int(t) for t in sample.tokens], [int(m) for m in sample.loss_mask]
    header = assistant_header_ids(tokenizer)
    im_end = tokenizer.token_to_id(IM_END)
    starts = [int(c) for c in sample.chunk_starts]
    ends = set(starts[1:]) | {len(tokens)}
    # Where each chunk's own replies begin: at 0 in the first, at the first trained token after.
    own_from = [0] + [next((i for i in range(a, b) if mask[i]), b)
                      for a, b in zip(starts[1:], starts[2:] + [len(tokens)])]
    problems = []
    prompt_len = int(sample.metadata.get("prompt_len") or 0)
    if any(mask[:prompt_len]):
        problems.append(f"{sum(mask[:prompt_len])} of the {prompt_len} prompt tokens are trained")
    for start, end, trained in mask_runs(mask):
        if trained:
            if tokens[max(0, start - len(header)):start] != header:
                problems.append(f"trained tokens {start}:{end} do not follow an assistant header")
            if not (tokens[end - 1] == im_end or end in ends or tokens[end] == im_end):
                problems.append(f"trained tokens {start}:{end} run past the end of their turn")
        else:  # a header inside the context hands over to a reply, which must be trained
            for at in range(start + len(header), end):
                if tokens[at - len(header):at] != header or at in ends:
                    continue
                if at >= own_from[int(np.searchsorted(starts, at, side="right")) - 1]:
                    problems.append(f"the assistant reply at {at} is not trained")
    stray = np.flatnonzero((np.asarray(sample.loss_mask) == 0)
                           & (np.asarray(sample.rollout_logprobs) != 0))
    if len(stray):
        problems.append(f"{len(stray)} untrained tokens carry a sampling log-prob "
                        f"(first at {int(stray[0])})")
    if sampled_tokens is not None and sum(mask) != int(sampled_tokens):
        problems.append(f"{sum(mask)} trained tokens but the agent sampled {sampled_tokens}")
    return problems


__all__ = ["ROLLOUT_SETS", "check_loss_mask", "conversation_text", "eval_overview",
           "format_table", "mask_counts", "mask_html", "mask_runs", "mask_text",
           "rollout_trials", "task_table", "trial_table", "trials_of"]
