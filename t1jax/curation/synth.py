"""Recursive task synthesis (T1's RST): accepted tasks seed rewrites that extend their workflow
(`synth_operators`); each new task is validated in sandboxes; the accepted ones seed the next round.

Why three validation runs: the oracle must pass every assertion (the new step is stated and
solvable), a do-nothing agent must fail every new and goal assertion (the tests check work), and
the parent's solution alone must fail every new assertion (each checks the new step, not what the
parent already did)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import shutil
import tomllib
from collections import Counter
from pathlib import Path

from t1jax.rollout.fan_out import ImageBuildError, fan_out
from t1jax.rollout.trial import TrialSite, run_trial
from t1jax.sandbox.base import SandboxError
from t1jax.curation.synth_operators import (LLMConfig, Operator, Output, Parent, Rewrite,
                                         RewriteError, make_operators, top_level_names)
from t1jax.tasks.task import TaskFormatError, load_task
from t1jax.curation.validate import run_agent
from t1jax.verify.reward import INVARIANT, GlobalScale, static_assertion_count
from t1jax.verify.verifier import VerifierSettings

WORKDIR = "/app"
_NOT_OUTPUT = re.compile(r"(^|/)(__pycache__|\.git|\.pytest_cache|\.mypy_cache|site-packages|"
                         r"dist-packages|node_modules)(/|$)|\.py[co]$")  # caches, installs
_LEVELS, _MAX_ID = ("easy", "medium", "hard"), 64  # difficulties; longest new task id
_STAT = r'''import json, os, sys
out = []
for p in json.load(open(sys.argv[1])):
    if os.path.isfile(p) and not os.path.islink(p):
        data = open(p, "rb").read()
        try:
            text = b"\0" not in data and data.decode("utf-8") is not None
        except UnicodeDecodeError:
            text = False
        out.append([os.path.relpath(p, "/app"), len(data), text])
json.dump(out, open(sys.argv[1], "w"))
'''


def collect_outputs(backend, sandbox) -> tuple[Output, ...]:
    """Regular files a task's solution added or changed under /app (caches, .git left out)."""
    paths = sorted({p for kind, p in backend.changes(sandbox) if kind in ("A", "C")
                    and p.startswith(WORKDIR + "/") and not _NOT_OUTPUT.search(p)})
    if not paths:
        return ()
    tmp = "/tmp/.t1jax_synth_outputs.json"  # paths in, rows out: stdout may be cut short
    sandbox.put(tmp, json.dumps(paths).encode())
    res = sandbox.exec(f"python3 - {tmp} <<'T1JAX_PY'\n{_STAT}T1JAX_PY", timeout=300)
    if res.exit_code != 0:
        raise SandboxError(f"could not list the outputs: {res.output[-500:]}")
    rows = json.loads(sandbox.get(tmp))
    sandbox.exec(f"rm -f {tmp}", timeout=60)
    return tuple(Output(*row) for row in rows)


@dataclasses.dataclass
class Node:
    """A task that may seed the next round."""
    task: object
    root_id: str
    lineage: tuple[str, ...] = ()  # operators, root -> task
    chain: tuple[str, ...] = ()  # task ids, root -> task
    outputs: tuple[Output, ...] | None = None  # None: not collected yet


@dataclasses.dataclass
class Candidate:
    task_id: str
    parent_id: str
    root_id: str
    round: int
    operator: str
    lineage: tuple[str, ...]
    chain: tuple[str, ...]
    path: Path
    status: str = "pending"  # accepted | rejected
    reason: str = ""
    new_tests: tuple[str, ...] = ()
    new_paths: tuple[str, ...] = ()
    assertions: int = 0
    outputs: tuple[Output, ...] = ()

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "path": str(self.path),
                "outputs": [o.path for o in self.outputs]}


@dataclasses.dataclass
class SynthReport:
    rounds: int
    seed: int
    operators: list[str]
    candidates: list[Candidate] = dataclasses.field(default_factory=list)
    infeasible: list[dict] = dataclasses.field(default_factory=list)  # {round, task_id, reason}

    @property
    def accepted(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "accepted"]

    def counts(self) -> dict[int, dict[str, dict]]:
        """round -> operator -> {"accepted": n, "rejected": n, "reasons": [...]}"""
        out: dict = {}
        for c in self.candidates:
            cell = out.setdefault(c.round, {}).setdefault(
                c.operator, {"accepted": 0, "rejected": 0, "reasons": []})
            cell[c.status] += 1
            cell["reasons"] += [c.reason] if c.status == "rejected" else []
        return out

    def assertion_counts(self) -> dict[int, int]:
        """assertion count -> how many accepted tasks have it"""
        return dict(sorted(Counter(c.assertions for c in self.accepted).items()))


def child_id(parent_id: str, code: str, rnd: int, taken: set[str]) -> str:
    """`<parent-id>--<op>-r<round>`; a long parent id is cut and hashed so ids stay short."""
    suffix, head = f"--{code}-r{rnd}", parent_id
    if len(head) + len(suffix) > _MAX_ID:
        digest = hashlib.sha1(parent_id.encode()).hexdigest()[:6]
        head = parent_id[:_MAX_ID - len(suffix) - 7].rstrip("-") + "-" + digest
    k = 1
    while (new := head + suffix + (f"-{k}" if k > 1 else "")) in taken:
        k += 1
    taken.add(new)
    return new


def _toml(v, key: bool = False) -> str:
    if key:  # bare when it can be, else quoted
        return v if re.fullmatch(r"[A-Za-z0-9_-]+", v) else json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml(k, True)} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(_toml, v)) + "]"
    if isinstance(v, (bool, int, float, str)):
        return json.dumps(v, ensure_ascii=False)  # JSON's literals and escapes are TOML's too
    return v.isoformat()  # dates and times


def dump_toml(data: dict) -> str:
    """TOML for a task.toml-shaped dict: top-level scalars, then one table per section."""
    lines = [f"{_toml(k, True)} = {_toml(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{_toml(key, True)}]"]
            lines += [f"{_toml(k, True)} = {_toml(v)}" for k, v in table.items()]
    text = "\n".join(lines).lstrip("\n") + "\n"
    if tomllib.loads(text) != data:
        raise ValueError("task.toml did not survive a round trip")
    return text


def _append(path: Path, block: str, sep: str) -> None:
    path.write_text(path.read_text().rstrip("\n") + sep + block.rstrip("\n") + "\n")


def write_child(parent: Parent, op: Operator, rewrite: Rewrite, cand: Candidate) -> None:
    """Copy the parent to `cand.path`, then realign instruction, solution, tests and task.toml;
    the environment stays the parent's."""
    src, dst = parent.task.path, cand.path
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "lineage.json", "reason.txt", "llm_reply.txt"))
    test_file = dst / "tests" / "test_outputs.py"
    clash = top_level_names(test_file.read_text()) & top_level_names(rewrite.tests)
    if clash:
        raise RewriteError(f"new test code redefines existing names: {sorted(clash)}")
    tag = f"# --- t1jax synthesis, round {cand.round}: {op.name} ---\n"
    _append(dst / "instruction.md", rewrite.instruction, "\n\n---\n\n")
    _append(dst / "solution" / "solve.sh",
            f"{tag}set -euo pipefail\ncd {WORKDIR}\n{rewrite.solution}", "\n\n")
    _append(test_file, tag + rewrite.tests, "\n\n\n")
    data = tomllib.loads((src / "task.toml").read_text())
    task, meta = data.setdefault("task", {}), data.setdefault("metadata", {})
    task["name"] = (str(task.get("name", "")).rpartition("/")[0] or "t1jax") + "/" + cand.task_id
    if isinstance(task.get("description"), str):
        task["description"] = task["description"].rstrip() + f" Then {op.summary}."
    if meta.get("difficulty") in _LEVELS:  # one more step: one level harder
        meta["difficulty"] = _LEVELS[min(_LEVELS.index(meta["difficulty"]) + 1, 2)]
    meta.update(t1jax_parent=parent.task.task_id, t1jax_operator=op.name, t1jax_round=cand.round,
                t1jax_root=cand.root_id, t1jax_steps=int(meta.get("t1jax_steps", 1)) + 1)
    (dst / "task.toml").write_text(dump_toml(data))
    cand.new_paths = tuple(rewrite.new_paths)
    cand.new_tests = tuple(sorted(n for n in top_level_names(rewrite.tests) if n[:5] == "test_"))


def _func(assertion_name: str) -> str:
    return assertion_name.rsplit("::", 1)[-1].split("[", 1)[0].strip()


def judge(new: set[str], oracle, nothing, parent_run) -> str | None:
    """None to accept, else the reason to reject. Runs are (report, outputs, error)."""
    def passing(run, new_ones: bool):
        return sorted(a.name for a in run[0].assertions if a.status == "passed"
                      and (_func(a.name) in new) == new_ones
                      and (new_ones or not INVARIANT.search(a.name)))

    for run, who in ((oracle, "oracle"), (nothing, "do-nothing"), (parent_run, "parent-solution")):
        if run[0] is None or (run is oracle and run[2]):
            return f"{who} run failed: {run[2]}"
    failed = [a.name for a in oracle[0].assertions if a.status != "passed"]
    checks = ((sorted(new - {_func(a.name) for a in oracle[0].assertions}), "new tests never ran"),
              (failed or ([] if oracle[0].solved else ["(not solved)"]), "oracle fails"),
              (passing(nothing, True), "new assertion passes on do-nothing"),
              (passing(nothing, False), "goal assertion passes on do-nothing"),
              (passing(parent_run, True), "new assertion passes on the parent's solution"))
    return next((f"{why}: {names}" for names, why in checks if names), None)


class Synthesizer:
    """The sandbox work: parents' outputs, and the three validation runs of each candidate."""

    def __init__(self, site: TrialSite, verifier: VerifierSettings = VerifierSettings()):
        self.site, self.verifier = site, verifier

    def episode(self, task, solver, *, check=True, collect=False):
        """`solver`'s reference solution (None: do nothing) in a fresh sandbox of `task`'s
        image (built once), then `task`'s tests: (report or None, outputs, error). Never
        raises for a task's own failure."""
        def play(sandbox):
            if solver is not None:
                run_agent("oracle", solver, sandbox)
            return collect_outputs(self.site.backend, sandbox) if collect else ()

        scale = GlobalScale(max(static_assertion_count(task), 1), "synthesis") if check else None
        outcome = run_trial(task, self.site.with_(scale=scale), play, verifier=self.verifier,
                            grade_failed_play=False,
                            catch=(SandboxError, OSError, ValueError, ImageBuildError))
        if outcome.error is not None:
            return None, (), (str(outcome.play_error) if isinstance(
                outcome.play_error, ImageBuildError) else outcome.error)
        report = outcome.report
        return report, outcome.played, report.error if report else None

    def collect(self, nodes: list[Node], progress) -> dict[str, str]:
        """Fill in each node's outputs from one oracle run; returns task id -> error."""
        errors = {}

        def done(node, got) -> None:
            _, node.outputs, error = got
            if error:
                errors[node.task.task_id] = error
            progress("step", f"outputs of {node.task.task_id}")

        fan_out(nodes, lambda n: self.episode(n.task, n.task, check=False, collect=True),
                workers=self.site.concurrency, on_done=done, name="synth")
        return errors

    def validate(self, pending: list[tuple[Candidate, object]], progress) -> None:
        """Judge each (candidate, parent task) whose directory is written; sets its status:
        three runs each (its own oracle, doing nothing, the parent's oracle) on its image."""
        jobs = []
        for cand, parent_task in pending:
            try:
                child = load_task(cand.path)
                self.site.images.get(child)
            except (TaskFormatError, ImageBuildError) as err:
                cand.status, cand.reason = "rejected", f"invalid new task: {err}"
                progress("step", f"{cand.task_id}: {cand.status}")
                continue
            jobs += [(cand, child, solver) for solver in (child, None, parent_task)]
        runs = fan_out(jobs, lambda j: self.episode(j[1], j[2], collect=j[2] is j[1]),
                       workers=self.site.concurrency, name="synth")
        for i in range(0, len(jobs), 3):
            cand = jobs[i][0]
            oracle, nothing, parent_run = runs[i:i + 3]
            reason = judge(set(cand.new_tests), oracle, nothing, parent_run) \
                if cand.new_tests else "no new test functions"
            cand.status, cand.reason = ("rejected", reason) if reason else ("accepted", "")
            if oracle[0] is not None:
                cand.assertions, cand.outputs = oracle[0].total, oracle[1]
            progress("step", f"{cand.task_id}: {cand.status}")


def synthesize(seed_tasks, site: TrialSite, out_dir, *, rounds: int = 2, seed: int = 0,
               operators=None, per_round_limit: int = 8, llm: LLMConfig | None = None,
               verifier: VerifierSettings = VerifierSettings(), progress=None) -> SynthReport:
    """Run `rounds` rounds from `seed_tasks` (round 0) into `out_dir`: accepted tasks go to
    round-<r>/<id>/, rejected ones to rejected/<id>/ (with reason.txt); then summary.md and
    lineage.jsonl. `progress(kind, what, n)` hears "round" (n: steps planned), "grow" (n: steps
    added), "step" and "round_done". The sandbox work runs at `site` (at most
    site.concurrency at once); an interrupt does not wait, the caller reaps (site.run_id)."""
    (out_dir := Path(out_dir)).mkdir(parents=True, exist_ok=True)
    ops = make_operators(operators, llm)
    report = SynthReport(rounds, seed, [op.name for op in ops])
    taken = {t.task_id for t in seed_tasks}
    frontier = [Node(t, t.task_id, chain=(t.task_id,)) for t in seed_tasks]
    synth = Synthesizer(site, verifier)
    for rnd in range(1, rounds + 1):
        if frontier:
            frontier = _round(rnd, frontier, synth, ops, report, out_dir, taken, seed,
                              per_round_limit, progress or (lambda *a: None))
    (out_dir / "summary.md").write_text(summary_markdown(report))
    with open(out_dir / "lineage.jsonl", "w") as f:
        f.writelines(json.dumps(c.to_dict()) + "\n" for c in report.candidates)
    return report


def _with_outputs(order, synth, report, rnd, chunk, progress):
    """The parents in `order`, their outputs collected `chunk` at a time as they are asked for:
    a round with a limit collects little more than it uses."""
    for i in range(0, len(order), chunk):
        need = [n for n in order[i:i + chunk] if n.outputs is None]
        progress("grow", "outputs", len(need))
        failed = synth.collect(need, progress)
        report.infeasible += [{"round": rnd, "task_id": t, "reason": f"outputs unknown: {e}"}
                              for t, e in failed.items()]
        yield from (n for n in order[i:i + chunk] if n.task.task_id not in failed)


def _round(rnd, frontier, synth, ops, report, out_dir, taken, seed, limit, progress):
    """One round: pick a feasible operator per parent, write, validate, file the results."""
    order = sorted(frontier, key=lambda n: n.task.task_id)
    random.Random(f"{seed}:{rnd}").shuffle(order)  # which parents a per-round limit keeps
    progress("round", f"round {rnd}", min(limit, len(order)))
    cands, pending = [], []
    for node in _with_outputs(order, synth, report, rnd, limit, progress):
        parent = Parent(node.task, node.outputs, node.lineage, rnd, node.root_id)
        why = {op.name: op.feasible(parent) for op in ops}
        feasible = [op for op in ops if why[op.name] is None]
        if not feasible:
            report.infeasible.append({"round": rnd, "task_id": node.task.task_id, "reason":
                                      "; ".join(f"{k}: {v}" for k, v in why.items())})
            continue
        op = random.Random(f"{seed}:{rnd}:{node.task.task_id}").choice(feasible)
        new_id = child_id(node.task.task_id, op.code, rnd, taken)
        cand = Candidate(new_id, node.task.task_id, node.root_id, rnd, op.name,
                         node.lineage + (op.name,), node.chain + (new_id,),
                         out_dir / f"round-{rnd}" / new_id)
        shutil.rmtree(cand.path, ignore_errors=True)
        cands.append(cand)
        try:
            write_child(parent, op, op.rewrite(parent), cand)
            pending.append((cand, node.task))
        except Exception as err:  # a broken or confused operator rejects its task, not the run
            cand.status, cand.reason = "rejected", str(err) if isinstance(err, RewriteError) \
                else f"operator {op.name} failed: {type(err).__name__}: {err}"
            if getattr(err, "raw", None) is not None:
                cand.path.mkdir(parents=True, exist_ok=True)
                (cand.path / "llm_reply.txt").write_text(err.raw)
            progress("step", f"{cand.task_id}: rejected")
        if len(cands) >= limit:
            break
    synth.validate(pending, progress)
    report.candidates += cands
    accepted = []
    for cand in cands:
        if cand.status == "rejected":
            dest = out_dir / "rejected" / cand.task_id
            shutil.rmtree(dest, ignore_errors=True)
            cand.path.mkdir(parents=True, exist_ok=True)
            dest.parent.mkdir(exist_ok=True)
            cand.path = Path(shutil.move(cand.path, dest))
            (dest / "reason.txt").write_text(cand.reason + "\n")
        else:
            accepted.append(Node(load_task(cand.path), cand.root_id, cand.lineage, cand.chain,
                                 cand.outputs))
        (cand.path / "lineage.json").write_text(json.dumps(cand.to_dict(), indent=2) + "\n")
    progress("round_done", f"round {rnd}", 0)
    return accepted


def summary_markdown(report: SynthReport) -> str:
    counts, ops = report.counts(), report.operators
    lines = [f"# Task synthesis: {len(report.accepted)} of {len(report.candidates)} new tasks "
             f"accepted ({report.rounds} round(s), seed {report.seed})", "",
             "Cells: accepted / rejected. The offline operators leave environments unchanged.",
             "", "| round | " + " | ".join(ops) + " | all |", "|---" * (len(ops) + 2) + "|"]
    for rnd in range(1, report.rounds + 1):
        row = counts.get(rnd, {})
        cells = [row.get(o, {"accepted": 0, "rejected": 0}) for o in ops + ["all"]]
        cells[-1] = {k: sum(c[k] for c in row.values()) for k in ("accepted", "rejected")}
        lines.append(f"| {rnd} | " + " | ".join(f"{c['accepted']} / {c['rejected']}"
                                                 for c in cells) + " |")
    lines += ["", "## Assertions per accepted task", "", "| assertions | tasks |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report.assertion_counts().items()]
    sections = (("Rejected", [f"round {c.round} `{c.task_id}` ({c.operator}): {c.reason}"
                              for c in report.candidates if c.status == "rejected"]),
                ("Not extended", [f"round {i['round']} `{i['task_id']}`: {i['reason']}"
                                  for i in report.infeasible]),
                ("Accepted lineage", [f"{' -> '.join(c.chain)} ({', '.join(c.lineage)}; "
                                      f"{c.assertions} assertions)" for c in report.accepted]))
    for title, items in sections:
        if items:
            lines += ["", f"## {title}", ""] + [f"- {item[:400]}" for item in items]
    return "\n".join(lines) + "\n"
