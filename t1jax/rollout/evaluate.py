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
import os
import re
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from t1jax.rollout.agent import run_agent_episode
from t1jax.rollout.batching import BatchingEngine
from t1jax.rollout.engine import SeededCalls
from t1jax.rollout.eval_summary import (failure_mode, goal_fraction, summarize,
                                        summary_markdown)
from t1jax.rollout.fan_out import fan_out
from t1jax.rollout.harness import RolloutError
from t1jax.rollout.sample import make_sample
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.terminus_agent import run_terminus_episode
from t1jax.rollout.trial import TrialSite, run_trial
from t1jax.verify.reward import pool_scale

HARNESSES = ("tools", "terminus")
INTERNET_POLICIES = ("skip", "run")  # a task needing the internet on an offline sandbox
OUTPUT_CHARS = 2000  # per command output and verifier log kept in trials.jsonl


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


def sample_name(task_id: str, attempt: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', task_id)}--attempt{int(attempt)}.npz"


# -- batching concurrent callers ------------------------------------------------------------------

# -- the evaluation ------------------------------------------------------------------------------

INFRA_ATTEMPTS = 3  # tries of a trial whose engine, sandbox or verifier failed

def evaluate(tasks, engine, tokenizer, site: TrialSite, *, out_dir,
             episode: EpisodeSettings = EpisodeSettings(), label: str = "eval",
             attempts: int = 3, harness: str = "tools", internet_tasks: str = "skip",
             save_samples: bool = True, seed: int | None = None,
             progress: Callable[[str, str], Any] | None = None,
             share: tuple[int, int] = (0, 1),
             gather: Callable[[list], list[list]] | None = None) -> dict | None:
    """Run `attempts` trials of every task (fresh sandbox each), verify, write trials.jsonl,
    summary.json, summary.md and samples/*.npz to out_dir; return the summary.

    Why 15 parameters: where trials run (site) and how each episode plays (episode) come as
    one value each; the rest are this evaluation's own protocol (label, attempts, harness,
    internet policy, seed, samples kept, progress) and its multi-process split (share,
    gather), each read once here.

    engine: an Engine shared by all trials (it must take concurrent generate calls; an embedded
    JaxEngine is wrapped in a BatchingEngine so concurrent trials decode together), or a
    callable (task, attempt) -> Engine.
    site: the sandboxes (backend, limits, network, at most site.concurrency trials at once),
    the run id they are labelled and reaped by, the images (built once per task, reused by
    later evaluations with the same site's cache) and the dense reward's scale (default: the
    tasks' own).
    episode: how each episode plays and is verified (turns, sampling, budgets, prompt, tool
    format, context, verifier), the job's one EpisodeSettings; its command timeout and
    observation cap default to the site's limits, its system prompt to the harness's own.
    internet_tasks: "skip" tasks whose allow_internet the site cannot honour
    (site.allow_network False), or "run" them offline anyway.
    seed: None draws fresh sampling seeds; an int gives each trial's i-th turn
    call_seed(seed, task, attempt, i), so a rerun repeats and two policies evaluated with one
    seed are compared on the same random numbers (SeededCalls).
    progress(kind, what): kind "build" per task, "trial" per finished trial.
    share=(i, n), gather: one of n processes playing every n-th (task, attempt) (each builds
    the images of its own trials, runs its own sandboxes and engine); gather(rows) returns
    every process's rows (each calls it), and process 0 writes the files and returns the
    summary (None elsewhere). Seeds are per (task, attempt, turn), so a split plays the
    trials one process would.
    """
    if harness not in HARNESSES:
        raise ValueError(f"harness {harness!r}; choose one of {HARNESSES}")
    if internet_tasks not in INTERNET_POLICIES:
        raise ValueError(f"internet_tasks {internet_tasks!r}; choose one of {INTERNET_POLICIES}")
    if attempts < 1:
        raise ValueError(f"need attempts >= 1, got {attempts}")
    t_start = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_dir = out_dir / "samples"
    tasks = list(tasks)
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate task ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    site = site if site.scale is not None else site.with_(scale=pool_scale(tasks))
    scale, images, allow_network = site.scale, site.images, site.allow_network
    play_episode = run_agent_episode if harness == "tools" else run_terminus_episode
    if type(engine).__name__ == "JaxEngine":  # one generate call at a time: batch the trials
        engine = BatchingEngine(engine)
    episode = episode.with_limits(site.limits)

    pairs = [(t, a) for t in tasks for a in range(attempts)][share[0]::share[1]]
    mine = {t.task_id for t, _ in pairs}
    mine = [t for t in tasks if t.task_id in mine]
    skipped = {t.task_id: why for t in mine
               if (why := skip_reason(t, allow_network, internet_tasks)) is not None}
    if progress:
        for task_id in skipped:
            progress("build", task_id)
    skipped.update(images.build_all([t for t in mine if t.task_id not in skipped],
                                    progress and (lambda tid: progress("build", tid))))

    def play_once(task, attempt: int, row: dict):
        """One try of a trial: (trajectory, report, error, box, infra), where infra says why
        it failed for a reason outside the policy (an engine or sandbox exception, a verifier
        that could not run), or is None."""
        traj, report, error, box, infra = None, None, None, None, None
        try:
            inner = engine if hasattr(engine, "generate") else engine(task, attempt)
            if seed is not None:
                inner = SeededCalls(inner, seed, task.task_id, attempt)
        except Exception as err:  # noqa: BLE001 - no engine for this trial
            error = infra = f"{type(err).__name__}: {err}"
        else:
            def play(sandbox):
                nonlocal box
                box = _CapturingSandbox(sandbox)
                return play_episode(task, inner, tokenizer, box, episode)

            # an agent failure is graded too: the sandbox is as it left it
            outcome = run_trial(task, site, play, verifier=episode.verifier)
            traj, report, err = outcome.played, outcome.report, outcome.play_error
            if isinstance(err, RolloutError):  # the policy's own: over its token budget
                error = f"RolloutError: {err}"
                if "does not fit max_tokens" in str(err):  # the task's first prompt
                    row["finish"] = "prompt"
            elif err is not None:  # an engine or sandbox failure
                error = infra = f"{type(err).__name__}: {err}\n" + "".join(
                    traceback.format_exception(err, limit=3))
            if (verr := outcome.verify_error) is not None:  # the verifier failed
                row["verifier_log"] = f"verifier failed: {type(verr).__name__}: {verr}"
                infra = infra or row["verifier_log"]
            elif report is not None and report.blame == "infra":  # ours: played again
                infra = infra or f"verifier: {report.infra_cause}: {report.error}"
        return traj, report, error, box, infra

    def trial(task, attempt: int) -> dict:
        row = _base_row(task, attempt, label, harness)
        t0 = time.monotonic()
        # A failure outside the policy (a container removed under the trial, a daemon error)
        # is no verdict on it: the trial is played again, and with a seed it samples the same
        # tokens. One that keeps failing is failure mode "infra_error", excluded from every
        # rate and named in summary.md (eval_summary.NOT_SCORED).
        for _ in range(INFRA_ATTEMPTS):
            row.update(verifier_log="", finish="")
            traj, report, error, box, infra = play_once(task, attempt, row)
            if infra is None or (report is not None and report.solved):
                break
            row["infra_failures"] = [*row.get("infra_failures", []), infra[-OUTPUT_CHARS:]]
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
            if report.stand_in_notes:  # ran on another toolchain than test.sh asked for
                row["stand_in_notes"] = report.stand_in_notes
            if report.blame == "agent":  # what it left broke its tests: a 0, as in training
                row.update(resolved=False, reward=0.0)
        if error is not None:
            row["error"] = error[-OUTPUT_CHARS:]
        row["failure_mode"] = failure_mode(row["finish"], report, error, infra)
        row["duration_s"] = round(time.monotonic() - t0, 3)
        if save_samples and traj is not None:
            sample = make_sample(traj, report, task.task_id, attempt, task.category or "")
            sample.metadata.update(label=label, harness=harness,
                                   failure_mode=row["failure_mode"])
            samples_dir.mkdir(parents=True, exist_ok=True)
            sample.to_npz(samples_dir / sample_name(task.task_id, attempt))
        return row

    rows: list[dict] = []
    for task, a in pairs:
        if task.task_id in skipped:
            row = _base_row(task, a, label, harness)
            row.update(status="skipped", skip_reason=skipped[task.task_id],
                       failure_mode="skipped")
            rows.append(row)
    jobs = [(t, a) for t, a in pairs if t.task_id not in skipped]
    partial = out_dir / ("trials.jsonl.partial" if share[1] == 1
                         else f"trials.p{share[0]}.jsonl.partial")
    with open(partial, "w") as live:
        def done(job, row: dict) -> None:
            rows.append(row)
            live.write(json.dumps(row) + "\n")
            live.flush()
            if progress:
                progress("trial", f"{row['task_id']}/{row['attempt']}: {row['failure_mode']}")

        fan_out(jobs, lambda job: trial(*job), workers=site.concurrency, on_done=done,
                backend=site.backend, run_id=site.run_id, name="eval")
    if gather is not None:  # every process's rows, on every process
        for row in rows:
            row["process"] = share[0]  # who played it: where its sandbox and log lines were
        rows = [row for share_rows in gather(rows) for row in share_rows]
        if share[0] != 0:
            partial.unlink(missing_ok=True)
            return None
    order = {t: i for i, t in enumerate(ids)}
    rows.sort(key=lambda r: (order[r["task_id"]], r["attempt"]))
    with open(out_dir / "trials.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    partial.unlink(missing_ok=True)
    summary = summarize(rows, label=label, harness=harness, attempts=attempts,
                        duration_s=time.monotonic() - t_start, seed=seed)
    # the dense reward's denominator: the same for every trial, whatever tasks ran beside
    summary["reward_scale"] = {"value": scale.value, "source": scale.source}
    (out_dir / "summary.md").write_text(summary_markdown(summary))
    # summary.json marks the evaluation finished (a rerun keeps it): written whole or not at all
    tmp = out_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out_dir / "summary.json")
    return summary


def read_trials(path) -> list[dict]:
    """trials.jsonl back as a list of dicts."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


__all__ = ["HARNESSES", "evaluate", "read_trials", "segments", "skip_reason"]
