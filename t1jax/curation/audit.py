"""Task audit: score every task on eight quality dimensions (T1's weights) and hard-reject tasks
that would teach the wrong thing.

Why: a task that validates (oracle passes, do-nothing fails) can still be bad training data: a
verifier that an empty output file satisfies, a test checking a file the instruction never
names, a solution hard-coding the answer, tests copied into the agent's image. Each dimension is
scored 0..1 from static reads of the task dir and from probes in real sandboxes: oracle,
do-nothing and two shortcut episodes, and a scan of the files the agent's image holds.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from t1jax.curation.audit_static import (check_coverage, file_texts, instruction_clarity,
                                     output_paths, secret_files, solution_substance, static_leaks)
from t1jax.curation.llm import LLMConfig, chat
from t1jax.curation.validate import run_episode
from t1jax.rollout.fan_out import ImageBuildError, fan_out
from t1jax.rollout.trial import TrialSite
from t1jax.verify.reward import INVARIANT, pool_scale, static_assertion_count
from t1jax.verify.verifier import VerifierSettings

WEIGHTS = {"verifier": 0.45, "solution": 0.25, "instruction": 0.20, "value": 0.10}
DIMENSIONS = {"verifier": ("strength", "granularity", "shortcut_resistance"),
              "solution": ("correct", "substance"), "instruction": ("coverage", "clarity"),
              "value": ("task_value",)}
SHORTCUTS = {"shortcut-empty": "", "shortcut-zero": "0\n"}  # probe -> content of faked outputs
PROBES = ("oracle", "nothing", *SHORTCUTS)  # the do-nothing probe also scans the image
JUDGE_DIMS = ("instruction.clarity", "value.task_value")
DIFFICULTY = {"easy": 0.5, "medium": 0.8, "hard": 1.0}
_PRUNE = ("\\( -path /proc -o -path /sys -o -path /usr -o -path '/lib*' -o -path /bin -o -path "
          "/sbin -o -path /etc -o -path /var/lib \\) -prune -o")
_OUT = ("/tmp/.t1jax-audit-paths", "/tmp/.t1jax-audit-sha")
_SCAN = (f"find / -xdev {_PRUNE} -print0 > {_OUT[0]} 2>/dev/null; find / -xdev {_PRUNE} -type f "
         f"-size -1048576c -print0 2>/dev/null | xargs -0 -r sha256sum > {_OUT[1]} 2>/dev/null")


@dataclasses.dataclass
class AuditReport:
    task_id: str
    scores: dict[str, float]
    group_scores: dict[str, float]
    quality: float
    rejected: bool
    reasons: list[str]  # hard-reject reasons first, then "note: ..." soft findings
    details: dict


class JudgeError(ValueError):
    """The LLM judge's reply was not the JSON asked for."""


def shortcut_agent(task, content: str):
    """Sandbox preparation: every path the instruction names that does not exist yet is
    created holding `content` (a directory where the path ends in /)."""
    def make(p: str) -> str:
        return f"mkdir -p {_q(p)}" if p.endswith("/") else \
            f"mkdir -p {_q(str(Path(p).parent))} && printf %s {_q(content)} > {_q(p)}"

    def prepare(sandbox) -> None:
        script = "; ".join(f"[ -e {_q(p.rstrip('/'))} ] || {{ {make(p)}; }} 2>/dev/null"
                           for p in output_paths(task.instruction))
        if script:
            sandbox.exec(script + "; true", timeout=60)
    return prepare


class _ProbeBackend:
    """The backend for one probe episode: prepares the agent's sandbox before run_episode's
    scripted agent runs, and keeps what that returned and what the verifier found changed."""

    def __init__(self, backend, prepare=None):
        self._backend, self._prepare, self.prepared, self.seen = backend, prepare, None, None

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def create(self, spec):
        sandbox = self._backend.create(spec)
        if self._prepare and not spec.readonly_mounts:  # the agent's, not the verifier's
            try:
                self.prepared = self._prepare(sandbox)
            except BaseException:
                sandbox.close()
                raise
        return sandbox

    def changes(self, sandbox):
        found = self._backend.changes(sandbox)
        self.seen = found if self.seen is None else self.seen
        return found


def scan_image(sandbox) -> dict:
    """Every path the agent sees outside system dirs, and the sha256 of each file under 1 MiB,
    in a fresh sandbox (the do-nothing probe's, before its verifier snapshot)."""
    sandbox.exec(_SCAN, timeout=300)
    paths, sums = (sandbox.get(p).decode(errors="replace") for p in _OUT)
    sandbox.exec(f"rm -f {' '.join(_OUT)}", timeout=60)
    files = dict(reversed(line.lstrip("\\").split("  ", 1)) for line in sums.splitlines()
                 if "  " in line)
    return {"paths": set(paths.split("\0")) - {"", *_OUT},
            "files": {p: d for p, d in files.items() if p not in _OUT}}


def _probe(name, task, site, verifier, judge):
    """(episode result, agent changes, image scan), or the judge's scores, or the exception
    (recorded on the task, never raised)."""
    try:
        if name == "judge":
            return judge(task)
        prepare = shortcut_agent(task, SHORTCUTS[name]) if name in SHORTCUTS else \
            scan_image if name == "nothing" else None
        probe = _ProbeBackend(site.backend, prepare)  # the images stay the site's
        result = run_episode(task, "oracle" if name == "oracle" else "nothing",
                             site.with_(backend=probe), verifier)
        return result, probe.seen or [], probe.prepared
    except Exception as err:
        return err


def _goal(result) -> tuple[int, int, list[str]]:
    goals = [a for a in result.report.assertions if not INVARIANT.search(a.name)]
    return (sum(a.status == "passed" for a in goals), len(goals),
            [a.name for a in goals if a.status == "passed"])


def score_task(task, runs: dict) -> AuditReport:
    """Static checks plus probe outcomes (`runs`: probe name -> result, or the exception)."""
    scores, hard, notes, details = {}, [], [], {"warnings": [], "probes": {}}
    ep = {n: g[0] for n, g in runs.items() if isinstance(g, tuple)}
    for name, got in runs.items():
        if isinstance(got, BaseException) and name != "judge":
            hard.append(str(got) if name == "build" else
                        f"audit error: {name} probe: {type(got).__name__}: {got}")
    for name, r in ep.items():
        details["probes"][name] = {"error": r.error, **({} if r.report is None else dict(
            passed=r.report.passed, total=r.report.total, goal=_goal(r)[:2],
            solved=r.report.solved))}
        if r.report is None and name != "oracle":  # an oracle without a report is broken
            hard.append(f"audit error: the {name} probe got no verifier report: {r.error}")
    oracle, nothing = ep.get("oracle"), ep.get("nothing")
    scan = runs["nothing"][2] if "nothing" in ep else None
    rep = oracle.report if oracle else None
    ok = bool(rep and not oracle.error and rep.total and rep.passed == rep.total and rep.solved)
    scores["solution.correct"] = float(ok)
    if oracle and not ok:
        failed = [a.name for a in (rep.assertions if rep else []) if a.status != "passed"]
        hard.append(f"broken oracle: solution fails {failed[:5]}" + (
            f" ({oracle.error})" if oracle.error else ""))
    scores["verifier.strength"] = 0.0
    if nothing and nothing.report:
        passed, total, names = _goal(nothing)
        solved = nothing.report.solved
        scores["verifier.strength"] = 0.0 if solved or not total else 1 - passed / total
        if passed or solved or not total:
            hard.append(f"weak verifier: doing nothing passes {passed}/{total} goal assertions "
                        f"{names[:5]}" + (" and solves the task" if solved else ""))
    fractions = []
    for name in (n for n in SHORTCUTS if ep.get(n) and ep[n].report):
        passed, total, names = _goal(ep[name])
        fractions.append(passed / total if total else 1.0)
        fake = f"creating {output_paths(task.instruction)} holding {SHORTCUTS[name]!r}"
        if ep[name].report.solved:
            hard.append(f"solution shortcut: {fake} solves the task ({name})")
        elif passed:
            notes.append(f"{fake} passes {passed}/{total} goal assertions {names[:5]}")
    scores["verifier.shortcut_resistance"] = 1 - max(fractions) if fractions else 0.0
    count = max(static_assertion_count(task), rep.total if rep else 0)
    scores["verifier.granularity"] = min(1.0, count / 6)
    if count < 3:
        hard.append(f"too few assertions: {count} (at least 3 needed)")
    scores["solution.substance"], details["solve_lines"], answers = solution_substance(task)
    if answers:
        notes.append(f"solve.sh hard-codes strings the tests expect: {[a[:40] for a in answers]}")
    leaks, scanned = static_leaks(task), isinstance(scan, dict)
    if scanned:
        secrets = secret_files(task)
        leaks += [f"{p} in the agent's image is a copy of {secrets[d]}"
                  for p, d in sorted(scan["files"].items()) if d in secrets]
    hard += [f"test leakage: {leak}" for leak in leaks]
    diff = runs["oracle"][1] if "oracle" in ep else None
    hidden, missing = check_coverage(task, scan["paths"] if scanned else None, None if diff is None
                                     else {p for k, p in diff if k == "A"})
    hard += [f"hidden requirement: the tests use {h}, which the instruction never names"
             for h in hidden]
    if missing:
        notes.append(f"instruction does not show formats the tests compare: {missing}")
    scores["instruction.coverage"] = 0.0 if hidden else 1 - 0.5 * min(1, len(missing) / 4)
    scores["instruction.clarity"], clarity_notes = instruction_clarity(task)
    notes += clarity_notes
    weight = DIFFICULTY.get((task.difficulty or "").lower(), 0.5)
    scores["value.task_value"] = 0.8 * weight + 0.1 * bool(task.category) + 0.1 * bool(task.tags)
    if isinstance(judged := runs.get("judge"), BaseException):
        details["warnings"].append(f"LLM judge ignored: {type(judged).__name__}: {judged}")
    elif judged is not None:
        for dim in JUDGE_DIMS:
            scores[dim] = (scores[dim] + judged[dim]) / 2
        details["judge"] = judged
    details.update(hidden=hidden, missing_formats=missing, leaks=leaks, assertions=count)
    groups = {g: sum(scores[f"{g}.{d}"] for d in ds) / len(ds) for g, ds in DIMENSIONS.items()}
    quality = sum(WEIGHTS[g] * v for g, v in groups.items())
    return AuditReport(task.task_id, {k: round(v, 4) for k, v in sorted(scores.items())},
                       {k: round(v, 4) for k, v in groups.items()}, round(quality, 4),
                       bool(hard), hard + [f"note: {n}" for n in notes], details)


def audit_pool(tasks, site: TrialSite, *, verifier: VerifierSettings = VerifierSettings(),
               judge=None, progress=None) -> list[AuditReport]:
    """Build every image, run all probes in parallel sandboxes (at most site.concurrency;
    site.scale, default the pool's own, grades them), score; best first, rejected last.
    `judge(task) -> {dim: score}` (e.g. a partial of llm_judge) is optional. An interrupt does
    not wait for running probes; the caller reaps their sandboxes (site.run_id)."""
    site = site if site.scale is not None else site.with_(scale=pool_scale(tasks))
    runs = {t.task_id: {} for t in tasks}
    for task_id, why in site.images.build_all(tasks, progress and (
            lambda tid: progress("build", tid))).items():
        runs[task_id]["build"] = ImageBuildError(why)
    names = PROBES + (("judge",) if judge else ())
    for task_id in (t for t in runs if progress and "build" in runs[t]):
        for name in names:  # probes that will not run still count as done
            progress("judge" if name == "judge" else "probe", f"{task_id}/{name}")
    jobs = [(t, n) for t in tasks if "build" not in runs[t.task_id] for n in names]

    def done(job, got) -> None:
        task, name = job
        runs[task.task_id][name] = got
        if progress:
            progress("judge" if name == "judge" else "probe", f"{task.task_id}/{name}")

    fan_out(jobs, lambda job: _probe(job[1], job[0], site, verifier, judge),
            workers=site.concurrency, on_done=done, name="audit")
    reports = [score_task(t, runs[t.task_id]) for t in tasks]
    return sorted(reports, key=lambda r: (r.rejected, -r.quality, r.task_id))


def audit_task(task, site: TrialSite, **options) -> AuditReport:
    """Audit one task; options as for audit_pool."""
    return audit_pool([task], site, **options)[0]


_JUDGE_PROMPT = """You review tasks used to train terminal agents with reinforcement learning.
Score the task on two dimensions, each a number from 0 to 1:
- "instruction.clarity": could a capable engineer do the task from the instruction alone, with
  every output location, format and edge case the tests check stated, nothing vague?
- "value.task_value": how much real terminal skill does solving it teach (trivial 0.1,
  routine 0.5, substantial multi-step work 0.9)?
Reply with only a JSON object: {"instruction.clarity": x, "value.task_value": y,
"rationale": "one or two sentences"}"""


def llm_judge(task, llm: LLMConfig) -> dict:
    """JUDGE_DIMS scores (and a rationale) from an OpenAI-compatible server (configs/audit.py
    asks for a short reply: judge.max_tokens); JudgeError or LLMError when it cannot give
    them."""
    tests = "\n\n".join(f"# {rel}\n{text[:3000]}" for rel, text in
                        file_texts(task.test_files().items()).items() if rel.endswith(".py"))
    user = (f"Difficulty: {task.difficulty or 'unset'}; category: {task.category or 'unset'}\n\n"
            f"## Instruction (what the agent sees)\n{task.instruction[:6000]}\n\n"
            f"## Tests (hidden from the agent)\n{tests[:6000]}")
    return parse_judge(chat(llm, [{"role": "system", "content": _JUDGE_PROMPT},
                                  {"role": "user", "content": user}]))


def parse_judge(text: str) -> dict:
    match = re.search(r"\{.*\}", text, re.S)
    try:
        data = json.loads(match[0]) if match else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise JudgeError(f"no JSON object in the judge's reply: {text[:200]!r}")
    for dim in JUDGE_DIMS:
        value = data.get(dim)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise JudgeError(f"judge score {dim} must be a number in 0..1, got {value!r}")
    return {**{d: float(data[d]) for d in JUDGE_DIMS},
            "rationale": str(data.get("rationale", ""))[:500]}


def write_reports(reports: list[AuditReport], out_dir) -> None:
    """audit.jsonl, audit.md (ranked tables, reasons) and scores.json (for the pool builder)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "audit.jsonl", "w") as f:
        f.writelines(json.dumps(dataclasses.asdict(r), default=str) + "\n" for r in reports)
    (out_dir / "scores.json").write_text(json.dumps(
        {r.task_id: {"score": r.quality, "rejected": r.rejected} for r in reports}, indent=2))
    dims = [f"{g}.{d}" for g, ds in DIMENSIONS.items() for d in ds]
    lines = [f"# Task audit: {len(reports)} tasks, {sum(r.rejected for r in reports)} rejected",
             "", "Quality = " + " + ".join(f"{w:g} x {g}" for g, w in WEIGHTS.items()) + ".", "",
             "| rank | task | quality | " + " | ".join(WEIGHTS) + " | verdict |",
             "|---" * 8 + "|"]
    lines += [f"| {i} | {r.task_id} | {r.quality:.3f} | " + " | ".join(
        f"{r.group_scores[g]:.2f}" for g in WEIGHTS) + f" | {'REJECT' if r.rejected else 'ok'} |"
        for i, r in enumerate(reports, 1)]
    lines += ["", "| task | " + " | ".join(dims) + " |", "|---" * (len(dims) + 1) + "|"]
    lines += [f"| {r.task_id} | " + " | ".join(f"{r.scores[d]:.2f}" for d in dims) + " |"
              for r in reports]
    lines += ["", "## Reasons", ""]
    for r in reports:
        lines.append(f"- **{r.task_id}**: " + ("; ".join(r.reasons) or "none").replace("|", "/"))
        lines += [f"  - warning: {w}" for w in r.details.get("warnings", [])]
    (out_dir / "audit.md").write_text("\n".join(lines) + "\n")


def _q(text: str) -> str:
    return "'" + str(text).replace("'", "'\\''") + "'"
