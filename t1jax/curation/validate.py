"""Pool validation: run every task with the oracle agent (its reference solution) and with a
do-nothing agent, verify both, and call a task healthy when its oracle passes every assertion
and doing nothing does not pass all of its goal assertions (nor solve it).

Assertions named `test_invariant_*` (our naming; no outside task follows it) check something
already true before the agent acts (an input left intact); every other assertion counts as a
goal assertion. That doing nothing passes some assertions is normal in outside tasks (they check
invariants under any name), so it is not a defect; it is listed as a leak (`nothing_leaks`):
with a dense reward, doing nothing then scores above the floor. This is the first phase of every
run: a task whose verifier cannot tell done from not-done teaches nothing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from t1jax.rollout.fan_out import ImageBuildError, fan_out
from t1jax.rollout.trial import TrialSite, run_trial
from t1jax.sandbox.base import SandboxError
from t1jax.tasks.task import resolve_env
from t1jax.verify.reward import GlobalScale, goal_assertions, pool_scale
from t1jax.verify.verifier import VerifierReport, VerifierSettings

AGENTS = ("oracle", "nothing")


@dataclasses.dataclass
class EpisodeResult:
    task_id: str
    agent: str
    report: VerifierReport | None
    agent_s: float
    total_s: float
    error: str | None = None
    # the oracle's solve.sh: its exit code and the tail of its output (why an oracle failed)
    solve_exit: int | None = None
    solve_tail: str = ""

    @property
    def goal_passed(self) -> int:
        if self.report is None:
            return 0
        return sum(a.status == "passed" for a in goal_assertions(self.report))


SOLVE_TAIL_CHARS = 1500


def run_agent(agent: str, task, sandbox):
    """The scripted agents: 'oracle' runs solution/solve.sh (returns its ExecResult: its exit
    code and output say why a reference solution failed); 'nothing' does nothing (None)."""
    if agent == "nothing":
        return None
    if agent != "oracle":
        raise ValueError(f"unknown scripted agent {agent!r}: {AGENTS}")
    if task.solution_script is None:
        raise SandboxError(f"task {task.task_id} has no reference solution (solution/solve.sh)")
    if task.layout == "tb1":  # solution.sh sits at the task root, beside the tests: copy it alone
        sandbox.put(f"/solution/{task.solution_script.name}", task.solution_script.read_bytes())
    else:
        sandbox.put_dir(str(task.solution_script.parent), "/solution")
    # as Harbor's oracle runs it: noninteractive apt, plus the task's [solution.env]
    env = {"DEBIAN_FRONTEND": "noninteractive",
           **resolve_env(task, task.solution.env, "solution.env")}
    env = " ".join(f"{k}={_q(v)}" for k, v in env.items())
    result = sandbox.exec(f"{env} bash /solution/{task.solution_script.name}",  # this exec only
                          timeout=task.agent.timeout_sec)
    if result.timed_out:
        raise SandboxError(f"task {task.task_id}: the oracle timed out after "
                           f"{task.agent.timeout_sec:.0f} s ([agent] timeout_sec); its output "
                           f"ends: {result.output[-SOLVE_TAIL_CHARS:]}")
    return result


def run_episode(task, agent: str, site: TrialSite,
                verifier: VerifierSettings = VerifierSettings()) -> EpisodeResult:
    """One trial at `site` (its scale grades it): fresh sandbox, agent, verification
    (`verifier`: how and where). Never raises for a task's own failure: the error is recorded
    on the result."""
    outcome = run_trial(task, site, lambda sandbox: run_agent(agent, task, sandbox),
                        verifier=verifier, grade_failed_play=False,
                        catch=(SandboxError, OSError, ValueError, ImageBuildError))
    report = outcome.report
    error = outcome.error or (report.error if report is not None else None)
    solved = outcome.played
    return EpisodeResult(task.task_id, agent, report, outcome.play_s, outcome.seconds, error,
                         solve_exit=None if solved is None else solved.exit_code,
                         solve_tail="" if solved is None else solved.output[-SOLVE_TAIL_CHARS:])


def validate_pool(tasks, site: TrialSite, *, out_dir: Path,
                  verifier: VerifierSettings = VerifierSettings(), agents=AGENTS,
                  progress=None) -> dict:
    """Build every task's environment, run each agent on each task in parallel sandboxes (at
    most site.concurrency; site.scale, default the pool's own, grades them), and write
    results.jsonl + results.md to `out_dir`. Returns the summary dict. An interrupt does not
    wait for running episodes; the caller reaps their sandboxes (site.run_id)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    site = site if site.scale is not None else site.with_(scale=pool_scale(tasks))
    build_errors = site.images.build_all(tasks, progress and (lambda t: progress("build", t)))
    results: list[EpisodeResult] = [
        EpisodeResult(t, a, None, 0.0, 0.0, why) for t, why in build_errors.items()
        for a in agents]
    jobs = [(task, agent) for task in tasks if task.task_id not in build_errors
            for agent in agents]

    def done(job, result: EpisodeResult) -> None:
        if progress:
            progress("episode", f"{result.task_id}/{result.agent}")

    results += fan_out(jobs, lambda job: run_episode(job[0], job[1], site, verifier),
                       workers=site.concurrency, on_done=done, name="validate")
    results.sort(key=lambda r: (r.task_id, agents.index(r.agent)))
    summary = summarize(results, site.scale)
    write_tables(results, summary, out_dir)
    return summary


def summarize(results: list[EpisodeResult], scale: GlobalScale) -> dict:
    by_task: dict[str, dict] = {}
    for r in results:
        row = by_task.setdefault(r.task_id, {"task_id": r.task_id})
        if r.agent == "oracle":
            ok = (r.report is not None and r.error is None and r.report.total > 0
                  and r.report.passed == r.report.total and r.report.solved)
            row["oracle_ok"] = ok
            if not ok and r.solve_exit is not None:  # why: what solve.sh said
                row["oracle_solve"] = {"exit_code": r.solve_exit, "tail": r.solve_tail}
        elif r.agent == "nothing":
            goals = len(goal_assertions(r.report)) if r.report is not None else 0
            row["nothing_ok"] = (r.report is not None and not r.report.solved
                                 and r.goal_passed < goals)
            row["nothing_leak"] = r.report is not None and 0 < r.goal_passed < goals
    for row in by_task.values():
        row["healthy"] = bool(row.get("oracle_ok", True) and row.get("nothing_ok", True))
    unhealthy = sorted(t for t, row in by_task.items() if not row["healthy"])
    leaks = sorted(t for t, row in by_task.items() if row.get("nothing_leak"))
    return {"tasks": len(by_task), "healthy": len(by_task) - len(unhealthy),
            "unhealthy": unhealthy, "pool_healthy": not unhealthy, "nothing_leaks": leaks,
            "global_scale": scale.value, "global_scale_source": scale.source}


def write_tables(results: list[EpisodeResult], summary: dict, out_dir: Path) -> None:
    with open(out_dir / "results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps({
                "task_id": r.task_id, "agent": r.agent, "error": r.error,
                "agent_s": round(r.agent_s, 3), "total_s": round(r.total_s, 3),
                "goal_passed": r.goal_passed, "solve_exit": r.solve_exit,
                "solve_tail": r.solve_tail,
                "report": r.report.to_dict() if r.report else None}, default=str) + "\n")
    lines = [f"# Pool validation: {summary['healthy']}/{summary['tasks']} tasks healthy", "",
             f"Dense reward = passed assertions / {summary['global_scale']:g} "
             f"({summary['global_scale_source']}).", "",
             "| task | agent | passed / total | goal passed | solved | reward | time (s) | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        rep = r.report
        cells = ([f"{rep.passed} / {rep.total}", str(r.goal_passed), "yes" if rep.solved else "no",
                  f"{rep.reward:.3f}"] if rep else ["-", "-", "-", "-"])
        note = (r.error or "") + (f" tampered: {rep.tampered}" if rep and rep.tampered else "")
        failed = not (rep and rep.solved and rep.passed == rep.total and not r.error)
        if r.agent == "oracle" and failed and r.solve_exit is not None:
            tail = " ".join(r.solve_tail.split())[-160:]
            note = (f"solve.sh exited {r.solve_exit}" + (f": ...{tail}" if tail else "")
                    + "; " + note)
        lines.append(f"| {r.task_id} | {r.agent} | " + " | ".join(cells)
                     + f" | {r.total_s:.1f} | {note.replace('|', '/')[:400]} |")
    if summary["unhealthy"]:
        lines += ["", "Unhealthy: " + ", ".join(summary["unhealthy"])]
    if summary.get("nothing_leaks"):
        lines += ["", "Doing nothing passes some goal assertions (healthy, but it scores above "
                  "the floor with a dense reward): " + ", ".join(summary["nothing_leaks"])]
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")


def _q(text: str) -> str:
    return "'" + str(text).replace("'", "'\\''") + "'"
