"""Evaluate a policy on a Harbor / Terminal-Bench directory the way T1 reports it.

Why: the T1 report's headline numbers are the resolved rate on Terminal-Bench 2.1 with the
Terminus-2 harness, a fresh sandbox per trial and 3 attempts per task averaged. `evaluate` runs
exactly that protocol (any harness, any engine) and writes what a reader needs to trust the
number: one JSON line per trial (with the decoded token sequence split by loss mask, every
command and its output, every assertion), the summary (resolved rate, dense reward, unbiased
pass@k, per category and difficulty, failure modes) as JSON and Markdown, and the trials as
replayable `.npz` samples. Tasks that cannot run here (they need the internet and the sandbox
has none, or their image does not build) are listed as skipped with the reason: they never count
as failures.

Used by the `eval` job (configs/eval.py) and by training jobs for periodic evaluations.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import traceback
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from t1jax.rollout.agent import RolloutError, run_agent_episode
from t1jax.rollout.agent import SYSTEM_PROMPT as TOOLS_SYSTEM_PROMPT
from t1jax.rollout.batching import BatchingEngine
from t1jax.rollout.engine import SamplingParams, SeededCalls
from t1jax.rollout.sample import make_sample
from t1jax.rollout.terminus import SYSTEM_PROMPT as TERMINUS_SYSTEM_PROMPT
from t1jax.rollout.terminus_agent import run_terminus_episode
from t1jax.rollout.trial import task_limits, task_sandbox_spec
from t1jax.sandbox.base import Limits
from t1jax.verify.reward import goal_assertions, pool_scale
from t1jax.verify.verifier import verify

HARNESSES = ("tools", "terminus")
SYSTEM_PROMPTS = {"tools": TOOLS_SYSTEM_PROMPT, "terminus": TERMINUS_SYSTEM_PROMPT}
FAILURE_MODES = ("resolved", "unresolved", "agent_timeout", "turn_limit", "context_exhausted",
                 "sandbox_limit", "verifier_error", "tampered", "agent_error", "skipped")
INTERNET_POLICIES = ("skip", "run")  # a task needing the internet on an offline sandbox
OUTPUT_CHARS = 2000  # per command output and verifier log kept in trials.jsonl
UNCATEGORIZED, UNRATED = "uncategorized", "unknown"


# -- metrics -------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts with c successes: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def failure_mode(finish: str, report, error: str | None = None) -> str:
    """Why a finished trial ended as it did. Order: the agent loop's own failure (error: a
    prompt over the context budget, an engine or sandbox exception) unless the task got solved
    anyway, the verifier's failure, tampering, success, then the agent's budget that ran out,
    else plainly unresolved."""
    if error is not None and not (report is not None and report.solved
                                  and not report.tampered):
        return "context_exhausted" if finish == "tokens" else "agent_error"
    if report is None:
        return "verifier_error"
    if report.tampered:
        return "tampered"
    if report.solved:
        return "resolved"
    if report.failed:
        return "verifier_error"
    return {"timeout": "agent_timeout", "turns": "turn_limit", "tokens": "context_exhausted",
            "context": "context_exhausted", "sandbox_limit": "sandbox_limit"}.get(finish, "unresolved")


def goal_fraction(report) -> float:
    """Passed goal assertions / goal assertions (all but `test_invariant_*`, which hold before
    the agent acts): progress a do-nothing agent cannot score, unlike the dense reward."""
    goals = goal_assertions(report)
    return sum(a.status == "passed" for a in goals) / len(goals) if goals else 0.0


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0


def _task_mean(rows, key: str) -> float:
    """Mean over tasks of each task's mean over its attempts (the T1 averaging)."""
    per_task = defaultdict(list)
    for r in rows:
        per_task[r["task_id"]].append(float(r[key]))
    return _mean(_mean(v) for v in per_task.values())


def summarize(rows: list[dict], *, label: str = "", harness: str = "",
              attempts: int | None = None, duration_s: float = 0.0,
              seed: int | None = None) -> dict:
    """The summary of trials.jsonl rows (skipped rows become the `skipped` list); seed: the
    evaluation's sampling seed (None: fresh draws, not repeatable)."""
    done = [r for r in rows if r["status"] == "done"]
    skipped = {}
    for r in rows:
        if r["status"] == "skipped":
            skipped.setdefault(r["task_id"], r["skip_reason"])
    per_task = defaultdict(list)
    for r in done:
        per_task[r["task_id"]].append(bool(r["resolved"]))
    n_min = min((len(v) for v in per_task.values()), default=0)
    attempts = attempts if attempts is not None else n_min
    pass_k = {}
    for k in range(1, max(min(attempts, n_min), 0) + 1):
        pass_k[str(k)] = _mean(pass_at_k(len(v), sum(v), k) for v in per_task.values())

    def group(key: str, default: str) -> dict:
        out = {}
        for value in sorted({r[key] or default for r in done}):
            sub = [r for r in done if (r[key] or default) == value]
            out[value] = {"resolved_rate": _task_mean(sub, "resolved"),
                          "avg_reward": _task_mean(sub, "reward"), "trials": len(sub),
                          "tasks": len({r["task_id"] for r in sub})}
        return out

    modes = Counter(r["failure_mode"] for r in done)
    return {
        "label": label, "harness": harness, "tasks": len(per_task), "attempts": attempts,
        "trials": len(done), "resolved_rate": _task_mean(done, "resolved"),
        "avg_reward": _task_mean(done, "reward"), "pass_at_k": pass_k,
        "goal_progress": _task_mean([r for r in done if "goal_frac" in r], "goal_frac"),
        "by_category": group("category", UNCATEGORIZED),
        "by_difficulty": group("difficulty", UNRATED),
        "turns_mean": _mean(r["turns"] for r in done),
        "tool_calls_mean": _mean(r["tool_calls"] for r in done),
        "tokens_mean": _mean(r["tokens"] for r in done),
        "sampled_tokens_mean": _mean(r["sampled_tokens"] for r in done),
        "chunks_mean": _mean(r.get("chunks", 1) for r in done),
        "compactions_mean": _mean(r.get("compactions", 0) for r in done),
        "failure_modes": {m: modes.get(m, 0) for m in FAILURE_MODES if m != "skipped"},
        "skipped": [{"task_id": t, "reason": why} for t, why in sorted(skipped.items())],
        "skipped_by_reason": dict(Counter(skip_kind(why) for why in skipped.values())),
        "duration_s": round(float(duration_s), 3), "sampling_seed": seed,
    }


def summary_markdown(summary: dict) -> str:
    """summary.md: overall, pass@k, per category, per difficulty, failure modes, skipped."""
    s = summary
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    lines = [f"# Evaluation: {s['label'] or '(unlabelled)'} ({s['harness']} harness)", "",
             "| tasks | attempts | trials | resolved | avg reward | goal progress | turns "
             "| tool calls | tokens | skipped | time |",
             "|---|---|---|---|---|---|---|---|---|---|---|",
             f"| {s['tasks']} | {s['attempts']} | {s['trials']} | {pct(s['resolved_rate'])} | "
             f"{s['avg_reward']:.3f} | {pct(s.get('goal_progress', 0.0))} | "
             f"{s['turns_mean']:.1f} | {s['tool_calls_mean']:.1f} | "
             f"{s['tokens_mean']:.0f} | {len(s['skipped'])} | {s['duration_s']:.0f} s |", ""]
    if s["pass_at_k"]:
        ks = list(s["pass_at_k"])
        lines += ["## pass@k", "", "| " + " | ".join(f"pass@{k}" for k in ks) + " |",
                  "|" + "---|" * len(ks),
                  "| " + " | ".join(pct(s["pass_at_k"][k]) for k in ks) + " |", ""]
    for title, key in (("category", "by_category"), ("difficulty", "by_difficulty")):
        lines += [f"## By {title}", "", f"| {title} | tasks | trials | resolved | avg reward |",
                  "|---|---|---|---|---|"]
        for name, g in s[key].items():
            lines.append(f"| {name} | {g['tasks']} | {g['trials']} | "
                         f"{pct(g['resolved_rate'])} | {g['avg_reward']:.3f} |")
        lines.append("")
    lines += ["## Failure modes", "", "| mode | trials |", "|---|---|"]
    lines += [f"| {m} | {n} |" for m, n in s["failure_modes"].items() if n]
    lines.append("")
    if s["skipped"]:
        lines += ["## Skipped tasks (not counted in the rates)", "", "| reason | tasks |",
                  "|---|---|"]
        lines += [f"| {_cell(k)} | {n} |" for k, n in (s.get("skipped_by_reason") or {}).items()]
        lines += ["", "| task | reason |", "|---|---|"]
        lines += [f"| {x['task_id']} | {_cell(x['reason'])} |" for x in s["skipped"]]
        lines.append("")
    return "\n".join(lines)


def _cell(text: str, n: int = 200) -> str:
    text = " ".join(str(text).split())
    return (text[:n] + "...") if len(text) > n else text.replace("|", "\\|")


# -- trial records -------------------------------------------------------------------------------

def mask_runs(loss_mask) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal mask as (start, end, trained)."""
    mask = [bool(m) for m in loss_mask]
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, mask[start]))
            start = i
    return runs


def segments(tokens, loss_mask, tokenizer) -> list[dict]:
    """The sequence decoded in maximal runs of equal loss mask (special tokens kept)."""
    return [{"text": tokenizer.decode([int(t) for t in tokens[start:end]],
                                      skip_special_tokens=False), "trained": trained}
            for start, end, trained in mask_runs(loss_mask[:len(tokens)])]


class _CapturingSandbox:
    """Keeps every exec's result (the agent records drop command outputs)."""

    def __init__(self, sandbox):
        self.sandbox, self.results = sandbox, []

    def exec(self, cmd, timeout=None):
        res = self.sandbox.exec(cmd, timeout=timeout)
        self.results.append(res)
        return res

    def __getattr__(self, name):
        return getattr(self.sandbox, name)


def _commands(traj, results) -> list[dict]:
    out, i = [], 0
    for turn, record in enumerate(traj.records):
        for c in record.commands:
            res = results[i] if i < len(results) else None
            i += 1
            out.append({"turn": turn, "command": c.command, "exit_code": c.exit_code,
                        "timed_out": bool(c.timed_out),
                        "output": (res.output if res is not None else "")[:OUTPUT_CHARS]})
    return out


def _base_row(task, attempt: int, label: str, harness: str) -> dict:
    return {"label": label, "task_id": task.task_id, "attempt": int(attempt),
            "category": task.category, "difficulty": task.difficulty, "harness": harness,
            "status": "done", "skip_reason": None, "resolved": False, "reward": 0.0,
            "passed": 0, "total": 0, "goal_frac": 0.0, "turns": 0, "tool_calls": 0, "tokens": 0,
            "sampled_tokens": 0, "finish": "", "failure_mode": "", "duration_s": 0.0,
            "instruction": task.instruction, "segments": [], "commands": [], "assertions": [],
            "verifier_log": ""}


def skip_reason(task, allow_network: bool, internet: str = "skip") -> str | None:
    """Why a task cannot be evaluated fairly here before any build (None: it can)."""
    if internet == "skip" and task.environment.allow_internet and not allow_network:
        return ("needs the internet (task.toml [environment] allow_internet, Harbor's default "
                "when unset) and the sandbox has none (config.sandbox.allow_network=False; "
                "config.internet_tasks=run runs it offline anyway)")
    return None


SKIP_KINDS = ("needs the internet", "image build failed")


def skip_kind(reason: str) -> str:
    """The kind of a skip reason, for counting skips per reason (the reason itself names the
    task's own error)."""
    return next((k for k in SKIP_KINDS if reason.startswith(k)), reason.split(":")[0][:60])


def skipped_note(summary: dict) -> str | None:
    """One line a user must see when tasks were skipped: how many of how many, and why."""
    counts = summary.get("skipped_by_reason") or {}
    if not counts:
        return None
    total = summary["tasks"] + len(summary["skipped"])
    why = "; ".join(f"{n} {kind}" for kind, n in counts.items())
    hints = []
    if "needs the internet" in counts:
        hints.append("--config.sandbox.allow_network=True where sandboxes may reach the "
                     "internet, or --config.internet_tasks=run to run them offline anyway")
    if "image build failed" in counts:
        hints.append("the build errors are in summary.md (a build that needs the network: "
                     "--config.sandbox.build_network=host)")
    return (f"skipped {len(summary['skipped'])} of {total} tasks ({why}): not counted in the "
            f"rates. " + "; ".join(hints))


def sample_name(task_id: str, attempt: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', task_id)}--attempt{int(attempt)}.npz"


# -- batching concurrent callers ------------------------------------------------------------------

# -- the evaluation ------------------------------------------------------------------------------

def evaluate(tasks, engine, tokenizer, backend, *, label: str = "eval", attempts: int = 3,
             harness: str = "tools", sampling: SamplingParams | None = None,
             limits: Limits = Limits(), scale=None, out_dir, concurrency: int = 4,
             max_turns: int = 300, max_tokens: int | None = None,
             timeout_s: float | None = None, command_timeout_s: float | None = None,
             max_observation_bytes: int | None = None, system_prompt: str | None = None,
             verifier_mode: str = "script", allow_network: bool = False,
             internet_tasks: str = "skip", run_id: str | None = None,
             images: dict | None = None, save_samples: bool = True, context=None,
             seed: int | None = None, progress: Callable[[str, str], Any] | None = None,
             tool_format: str = "qwen3_json") -> dict:
    """Run `attempts` trials of every task (fresh sandbox each), verify, write trials.jsonl,
    summary.json, summary.md and samples/*.npz to out_dir; return the summary.

    engine: an Engine shared by all trials (it must take concurrent generate calls; an embedded
    JaxEngine is wrapped in a BatchingEngine so concurrent trials decode together), or a
    callable (task, attempt) -> Engine.
    sampling: per-turn SamplingParams (max_new_tokens, temperature). max_tokens: the context
    budget (default the engine's max_len); timeout_s: per-trial wall clock (default the task's
    [agent] timeout_sec); command_timeout_s / max_observation_bytes default to `limits`.
    system_prompt: default the harness's own. internet_tasks: "skip" tasks whose allow_internet
    the sandbox cannot honour (allow_network False), or "run" them offline anyway.
    images: task_id -> built image, reused and filled in (periodic evaluations build once).
    seed: None draws fresh sampling seeds; an int gives each trial's i-th turn
    call_seed(seed, task, attempt, i), so a rerun repeats and two policies evaluated with one
    seed are compared on the same random numbers (SeededCalls).
    progress(kind, what): kind "build" per task, "trial" per finished trial.
    """
    if harness not in HARNESSES:
        raise ValueError(f"harness {harness!r}; choose one of {HARNESSES}")
    if internet_tasks not in INTERNET_POLICIES:
        raise ValueError(f"internet_tasks {internet_tasks!r}; choose one of {INTERNET_POLICIES}")
    if attempts < 1 or concurrency < 1:
        raise ValueError(f"need attempts >= 1 and concurrency >= 1, got {attempts}, "
                         f"{concurrency}")
    t_start = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_dir = out_dir / "samples"
    tasks = list(tasks)
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate task ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    sampling = sampling or SamplingParams(temperature=1.0, max_new_tokens=4096)
    scale = scale or pool_scale(tasks)
    run_id = run_id or f"eval-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    images = images if images is not None else {}
    episode = run_agent_episode if harness == "tools" else run_terminus_episode
    if type(engine).__name__ == "JaxEngine":  # one generate call at a time: batch the trials
        engine = BatchingEngine(engine)
    episode_kwargs = dict(
        max_turns=max_turns, max_tokens=max_tokens,
        command_timeout_s=float(command_timeout_s or limits.default_timeout_s),
        max_observation_bytes=int(max_observation_bytes or limits.max_output_bytes),
        system_prompt=system_prompt or SYSTEM_PROMPTS[harness])
    if context is not None:  # a t1jax.rollout.context.ContextPolicy (either harness)
        episode_kwargs["context"] = context
    if harness == "tools":  # Terminus-2 writes its own JSON commands, not tool calls
        episode_kwargs["tool_format"] = tool_format

    skipped: dict[str, str] = {}
    for task in tasks:  # builds are CPU-bound: one at a time
        why = skip_reason(task, allow_network, internet_tasks)
        if why is None and task.task_id not in images:
            try:
                images[task.task_id] = backend.build(task)
            except Exception as err:  # noqa: BLE001 - a task that cannot build is skipped
                why = f"image build failed: {type(err).__name__}: {_cell(str(err), 600)}"
        if why is not None:
            skipped[task.task_id] = why
        if progress:
            progress("build", task.task_id)

    def trial(task, attempt: int) -> dict:
        row = _base_row(task, attempt, label, harness)
        t0 = time.monotonic()
        traj, report, error, box = None, None, None, None
        try:
            inner = engine if hasattr(engine, "generate") else engine(task, attempt)
            if seed is not None:
                inner = SeededCalls(inner, seed, task.task_id, attempt)
            spec = task_sandbox_spec(task, images[task.task_id], limits, run_id=run_id,
                                     allow_network=allow_network)
            box = _CapturingSandbox(backend.create(spec))
            try:
                traj = episode(task, inner, tokenizer, box, sampling=sampling,
                               timeout_s=timeout_s, **episode_kwargs)
            except RolloutError as err:
                error = f"RolloutError: {err}"
                if "does not fit max_tokens" in str(err):
                    row["finish"] = "tokens"
            except Exception as err:  # noqa: BLE001 - an engine or sandbox failure: one trial
                error = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
            if box is not None:  # an agent failure is graded too: the sandbox is as it left it
                try:
                    report = verify(task, box.sandbox, backend, scale, mode=verifier_mode,
                                    run_id=run_id, limits=task_limits(task, limits),
                                    allow_network=allow_network)
                except Exception as err:  # noqa: BLE001 - the verifier failed: verifier_error
                    row["verifier_log"] = f"verifier failed: {type(err).__name__}: {err}"
        except Exception as err:  # noqa: BLE001 - no engine or no sandbox for this trial
            error = f"{type(err).__name__}: {err}"
        finally:
            if box is not None:
                try:
                    box.sandbox.close()
                except Exception:  # noqa: BLE001 - the run_id reap covers leftovers
                    pass
        if traj is not None:
            row.update(turns=traj.turns, tool_calls=traj.tool_calls, tokens=len(traj.tokens),
                       sampled_tokens=int(sum(r.sampled for r in traj.records)),
                       finish=traj.finish, segments=segments(traj.tokens, traj.loss_mask,
                                                             tokenizer),
                       chunks=len(getattr(traj, "chunk_starts", [0])),
                       compactions=int(getattr(traj, "compactions", 0)),
                       commands=_commands(traj, box.results))
        if report is not None:
            row.update(resolved=bool(report.solved and not report.tampered),
                       reward=float(report.reward), passed=report.passed, total=report.total,
                       assertions=[{"name": a.name, "status": a.status,
                                    "message": (a.message or "")[:OUTPUT_CHARS // 2]}
                                   for a in report.assertions],
                       goal_frac=goal_fraction(report),
                       verifier_log=(report.log or "")[-OUTPUT_CHARS:])
            if report.error:
                row["verifier_error"] = report.error
        if error is not None:
            row["error"] = error[-OUTPUT_CHARS:]
        row["failure_mode"] = failure_mode(row["finish"], report, error)
        row["duration_s"] = round(time.monotonic() - t0, 3)
        if save_samples and traj is not None:
            sample = make_sample(traj, report, task.task_id, attempt, task.category or "")
            sample.metadata.update(label=label, harness=harness,
                                   failure_mode=row["failure_mode"])
            samples_dir.mkdir(parents=True, exist_ok=True)
            sample.to_npz(samples_dir / sample_name(task.task_id, attempt))
        return row

    rows: list[dict] = []
    for task in tasks:
        if task.task_id in skipped:
            for a in range(attempts):
                row = _base_row(task, a, label, harness)
                row.update(status="skipped", skip_reason=skipped[task.task_id],
                           failure_mode="skipped")
                rows.append(row)
    jobs = [(t, a) for t in tasks if t.task_id not in skipped for a in range(attempts)]
    lock = threading.Lock()
    partial = out_dir / "trials.jsonl.partial"
    try:
        with open(partial, "w") as live, \
                ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="eval") as pool:
            futures = [pool.submit(trial, t, a) for t, a in jobs]
            for future in as_completed(futures):
                row = future.result()
                with lock:
                    rows.append(row)
                    live.write(json.dumps(row) + "\n")
                    live.flush()
                if progress:
                    progress("trial", f"{row['task_id']}/{row['attempt']}: "
                                      f"{row['failure_mode']}")
    finally:
        try:
            backend.reap(run_id)
        except Exception:  # noqa: BLE001
            pass
    order = {t: i for i, t in enumerate(ids)}
    rows.sort(key=lambda r: (order[r["task_id"]], r["attempt"]))
    with open(out_dir / "trials.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    partial.unlink(missing_ok=True)
    summary = summarize(rows, label=label, harness=harness, attempts=attempts,
                        duration_s=time.monotonic() - t_start, seed=seed)
    (out_dir / "summary.md").write_text(summary_markdown(summary))
    # summary.json marks the evaluation finished (a rerun keeps it): written whole or not at all
    tmp = out_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out_dir / "summary.json")
    return summary


def read_trials(path) -> list[dict]:
    """trials.jsonl back as a list of dicts."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


__all__ = ["FAILURE_MODES", "HARNESSES", "evaluate", "failure_mode",
           "pass_at_k", "read_trials", "segments", "skip_kind", "skip_reason", "skipped_note",
           "summarize", "summary_markdown"]
