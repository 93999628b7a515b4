"""The numbers of an evaluation, from its trials.jsonl rows: unbiased pass@k, why each trial
ended (failure modes), the per-task averaged summary and its Markdown, and the note on skipped
tasks.

Separate from evaluate.py, which runs the trials: these are pure functions of the rows, so a
report or a notebook recomputes them from a finished run without sandboxes or an engine.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from t1jax.rollout.fan_out import BUILD_FAILED
from t1jax.verify.reward import goal_assertions

FAILURE_MODES = ("resolved", "unresolved", "agent_timeout", "turn_limit", "context_exhausted",
                 "prompt_over_budget", "sandbox_limit", "verifier_broken", "verifier_error",
                 "tampered", "agent_error", "infra_error", "skipped")
# The buckets, written once: resolved and the policy's failures (every mode but these two) are
# scored; "infra_error" (ours: an engine, sandbox or daemon error, a verifier that could not
# start, an offline stand-in that lacks a package, after INFRA_ATTEMPTS tries) is excluded
# from every rate and named per task; "skipped" tasks never ran. "verifier_broken": the tests
# ran in what the agent left and timed out or wrote no results: scored 0, as in training.
NOT_SCORED = ("infra_error", "skipped")


def scored(row: dict) -> bool:
    """Whether a trials.jsonl row counts toward an evaluation's rates (NOT_SCORED)."""
    return row.get("status", "done") == "done" and row.get("failure_mode") not in NOT_SCORED


def excluded(rows: list[dict]) -> list[dict]:
    """The finished trials left out of the rates (infrastructure failures), each named with
    its task, attempt and the last reason it failed."""
    return [{"task_id": r.get("task_id"), "attempt": r.get("attempt"),
             "why": (r.get("infra_failures") or [r.get("verifier_error") or r.get("error")
                                                 or ""])[-1]}
            for r in rows if r.get("status", "done") == "done" and not scored(r)]
UNCATEGORIZED, UNRATED = "uncategorized", "unknown"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts with c successes: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def failure_mode(finish: str, report, error: str | None = None,
                 infra: str | None = None) -> str:
    """Why a finished trial ended as it did. Order: a failure outside the policy that its
    retries did not mend (infra: an engine or sandbox exception, a verifier that could not
    run or whose failure is ours) unless the task got solved anyway, the agent loop's own
    failure (a prompt over the context budget), tampering, success, a verification the
    agent's sandbox broke, then the agent's budget that ran out, else plainly unresolved."""
    if infra is not None and not (report is not None and report.solved):
        return "infra_error"
    if error is not None and not (report is not None and report.solved
                                  and not report.tampered):
        return {"tokens": "context_exhausted", "prompt": "prompt_over_budget"}.get(
            finish, "agent_error")
    if report is None:
        return "verifier_error"
    if report.tampered:
        return "tampered"
    if report.solved:
        return "resolved"
    if report.failed:
        return "infra_error" if report.blame == "infra" else "verifier_broken"
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
    modes = Counter(r["failure_mode"] for r in rows if r["status"] == "done")
    done = [r for r in rows if scored(r)]
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
        "excluded": excluded(rows),
        "prompt_over_budget": {r["task_id"]: ((r.get("error") or "").splitlines() or [""])[0]
                               for r in done if r["failure_mode"] == "prompt_over_budget"},
        "stand_in_notes": {t: sorted({n for r in rows if r["task_id"] == t
                                      for n in r.get("stand_in_notes") or []})
                           for t in sorted({r["task_id"] for r in rows
                                            if r.get("stand_in_notes")})},
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
    if s.get("reward_scale"):
        lines += [f"Dense reward = passed assertions / {s['reward_scale']['value']:g} "
                  f"({s['reward_scale']['source']}); resolved = every assertion passed.", ""]
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
    if s["failure_modes"].get("prompt_over_budget"):
        lines += ["## Prompts over the agent's context budget (scored 0: the agent never "
                  "acted)", "", "| task | prompt |", "|---|---|"]
        lines += [f"| {t} | {table_cell(why, 200)} |"
                  for t, why in s.get("prompt_over_budget", {}).items()]
        lines.append("")
    if s.get("stand_in_notes"):
        lines += ["## Offline stand-ins: other versions than test.sh asked for (warnings)", "",
                  "The tests ran, on the image's toolchain instead (BUILD.md, Terminal-Bench "
                  "2.x).", "", "| task | what differed |", "|---|---|"]
        lines += [f"| {t} | {table_cell('; '.join(notes), 400)} |"
                  for t, notes in s["stand_in_notes"].items()]
        lines.append("")
    if s.get("excluded"):
        lines += ["## Excluded trials (infrastructure failures: not counted in the rates)", "",
                  "| task | attempt | why |", "|---|---|---|"]
        lines += [f"| {x['task_id']} | {x['attempt']} | {table_cell(x['why'])} |"
                  for x in s["excluded"]]
        lines.append("")
    if s["skipped"]:
        lines += ["## Skipped tasks (not counted in the rates)", "", "| reason | tasks |",
                  "|---|---|"]
        lines += [f"| {table_cell(k)} | {n} |"
                  for k, n in (s.get("skipped_by_reason") or {}).items()]
        lines += ["", "| task | reason |", "|---|---|"]
        lines += [f"| {x['task_id']} | {table_cell(x['reason'])} |" for x in s["skipped"]]
        lines.append("")
    return "\n".join(lines)


def table_cell(text: str, n: int = 200) -> str:
    """One Markdown table cell: whitespace folded, cut at n characters, pipes escaped."""
    text = " ".join(str(text).split())
    return (text[:n] + "...") if len(text) > n else text.replace("|", "\\|")


SKIP_KINDS = ("needs the internet", BUILD_FAILED)


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
    if BUILD_FAILED in counts:
        hints.append("the build errors are in summary.md (a build that needs the network: "
                     "--config.sandbox.build_network=host)")
    return (f"skipped {len(summary['skipped'])} of {total} tasks ({why}): not counted in the "
            f"rates. " + "; ".join(hints))


__all__ = ["FAILURE_MODES", "NOT_SCORED", "SKIP_KINDS", "failure_mode", "goal_fraction",
           "pass_at_k", "scored", "excluded", "skip_kind", "skipped_note", "summarize", "summary_markdown",
           "table_cell"]
