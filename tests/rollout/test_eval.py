"""The evaluation (t1jax/rollout/evaluate.py and eval_summary.py, the `eval` job) on real Docker
sandboxes: pass@k against brute force; a scripted policy that plays the oracle on two seed tasks and
nothing on a third gives exactly the expected rates, failure modes, per-category numbers and
outputs; tasks that need the internet or do not build are skipped with their reason; the Terminus-2
harness path; and the job end to end through experiments/run.py with a randomly initialised tiny
policy.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from t1jax.rollout.eval_summary import pass_at_k, skipped_note, summarize
from t1jax.rollout.evaluate import evaluate, read_trials
from t1jax.rollout.batching import BatchingEngine
from t1jax.rollout.chat import IM_END, render_tool_call
from t1jax.rollout.engine import FINISH_STOP, GenerateResult, SamplingParams
from t1jax.rollout.oracle_data import FINAL_ANSWER, oracle_commands
from t1jax.rollout.sample import Sample
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.trial import TrialSite
from t1jax.tasks.task import load_task
from t1jax.verify.reward import GlobalScale

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "t1jax" / "tasks" / "seed_tasks"
ORACLE_TASKS = ("count-log-errors", "regex-log-redaction")  # 5 assertions each
NOTHING_TASK = "organize-files"
LAYERS, K = 2, 2
# count-log-errors in one line: terminus keystrokes run one command per typed line
SOLVE = ("cd /app && awk '$3 == \"[ERROR]\" { sub(/^service=/, \"\", $4); c[$4]++ } "
         "END { for (s in c) print s \": \" c[s] }' logs/*.log | sort -t: -k2,2nr -k1,1 "
         "> report.txt && awk -F': ' '{ t += $2 } END { print \"TOTAL: \" t }' report.txt "
         ">> report.txt && cat report.txt")


class KeyedEngine:
    """A scripted policy shared by concurrent trials: it finds the task by its instruction in
    the prompt and the turn by the assistant headers so far, and plays that task's script
    (tool calls or Terminus-2 JSON replies) or, for unknown tasks, answers at once."""

    weight_version = "keyed"
    max_len = 32768

    def __init__(self, tok, scripts: dict[str, list[str]], harness: str = "tools"):
        self.tok, self.harness = tok, harness
        self.scripts = {instr.strip().splitlines()[0]: cmds for instr, cmds in scripts.items()}
        self.outputs: list[str] = []  # every text returned (with its <|im_end|>)
        self.lock = threading.Lock()

    def reply(self, commands: list[str], turn: int) -> str:
        if self.harness == "tools":
            return render_tool_call(commands[turn]) if turn < len(commands) else FINAL_ANSWER
        if turn < len(commands):
            body = {"analysis": "", "plan": "", "task_complete": False,
                    "commands": [{"keystrokes": commands[turn] + "\n", "duration": 0.1}]}
        else:  # task_complete twice: the claim and its confirmation
            body = {"analysis": "done", "plan": "", "commands": [], "task_complete": True}
        return json.dumps(body)

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            text = self.tok.decode(list(prompt), skip_special_tokens=False)
            turn = text.count("<|im_start|>assistant") - 1
            commands = next((c for key, c in self.scripts.items() if key in text), [])
            reply = self.reply(commands, turn) + IM_END
            ids = self.tok.encode(reply, add_special_tokens=False).ids
            with self.lock:
                self.outputs.append(self.tok.decode(ids, skip_special_tokens=False))
            routes = np.full((len(prompt) + len(ids) - 1, LAYERS, K), -1, np.int32)
            out.append(GenerateResult(ids, [0.0] * len(ids), routes, FINISH_STOP, "keyed"))
        return out


def _copy_task(src: Path, dst: Path, *, toml_sub=None, dockerfile_extra=None) -> Path:
    shutil.copytree(src, dst)
    if toml_sub:
        toml = dst / "task.toml"
        text = toml.read_text()
        assert toml_sub[0] in text
        toml.write_text(text.replace(*toml_sub))
    if dockerfile_extra:
        with open(dst / "environment" / "Dockerfile", "a") as f:
            f.write(dockerfile_extra)
    return dst


def test_pass_at_k_matches_brute_force():
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(outcomes, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_batching_engine_coalesces_concurrent_calls():
    class Echo:
        max_len, weight_version = 100, "v"

        def __init__(self):
            self.sizes = []

        def generate(self, prompts, sampling):
            self.sizes.append(len(prompts))
            assert isinstance(sampling, list) and len(sampling) == len(prompts)
            return [GenerateResult([p[0] * 10], [0.0], np.zeros((1, 1, 1), np.int32),
                                   FINISH_STOP, "v") for p in prompts]

    inner = Echo()
    engine = BatchingEngine(inner, window_s=0.05)
    results, barrier = {}, threading.Barrier(6)

    def call(i):
        barrier.wait()
        results[i] = engine.generate([[i]], SamplingParams())[0].output_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: [i * 10] for i in range(6)}
    assert sum(inner.sizes) == 6 and len(inner.sizes) < 6  # some calls were decoded together


@pytest.mark.slow
def test_evaluate_oracle_nothing_and_skips(docker_backend, tok, tmp_path):
    tasks = [load_task(SEED / t) for t in ORACLE_TASKS + (NOTHING_TASK,)]
    tasks.append(load_task(_copy_task(
        SEED / "count-log-errors", tmp_path / "tasks" / "needs-internet",
        toml_sub=("allow_internet = false", "allow_internet = true"))))
    tasks.append(load_task(_copy_task(
        SEED / NOTHING_TASK, tmp_path / "tasks" / "broken-build",
        dockerfile_extra="\nRUN echo broken build >&2 && exit 3\n")))
    scripts = {t.instruction: oracle_commands(t)[0] for t in tasks[:2]}
    engine = KeyedEngine(tok, scripts)
    out = tmp_path / "eval"
    summary = evaluate(tasks, engine, tok, TrialSite(docker_backend, scale=GlobalScale(5, "test"),
                                                     concurrency=2),
                       label="oracle-test", attempts=2, harness="tools", episode=EpisodeSettings(
                           temperature=0.0, max_new_tokens=2048, max_turns=20, timeout_s=300.0),
                       out_dir=out)

    rows = read_trials(out / "trials.jsonl")
    assert summary == json.loads((out / "summary.json").read_text())
    assert len(rows) == 5 * 2
    done = [r for r in rows if r["status"] == "done"]
    by_task = {t: [r for r in done if r["task_id"] == t] for t in ORACLE_TASKS + (NOTHING_TASK,)}
    for t in ORACLE_TASKS:
        for r in by_task[t]:
            assert r["resolved"] and r["reward"] == 1.0 and r["passed"] == r["total"] == 5, r
            assert r["failure_mode"] == "resolved" and r["finish"] == "done"
            assert [c["command"] for c in r["commands"]] == scripts[r["instruction"]]
            assert all(c["exit_code"] == 0 and not c["timed_out"] for c in r["commands"])
            assert r["tool_calls"] == len(r["commands"]) and r["turns"] == r["tool_calls"] + 1
            assert all(a["status"] == "passed" for a in r["assertions"])
    for r in by_task[NOTHING_TASK]:
        assert not r["resolved"] and r["failure_mode"] == "unresolved"
        assert r["turns"] == 1 and r["tool_calls"] == 0 and r["commands"] == []
        assert r["passed"] < r["total"]
    # command outputs were captured: count-log-errors ends with `cat report.txt`-like output
    assert any("TOTAL" in c["output"] for r in by_task["count-log-errors"]
               for c in r["commands"])

    # skipped with reasons, never counted
    skipped = {s["task_id"]: s["reason"] for s in summary["skipped"]}
    assert set(skipped) == {"needs-internet", "broken-build"}
    assert "internet" in skipped["needs-internet"]
    assert "build failed" in skipped["broken-build"]
    assert all(r["failure_mode"] == "skipped" and r["skip_reason"] for r in rows
               if r["status"] == "skipped")
    assert summary["skipped_by_reason"] == {"needs the internet": 1, "image build failed": 1}
    note = skipped_note(summary)
    assert note.startswith("skipped 2 of 5 tasks (1 needs the internet; 1 image build failed)")
    assert "--config.internet_tasks=run" in note and "build_network=host" in note

    # the numbers
    assert summary["tasks"] == 3 and summary["trials"] == 6 and summary["attempts"] == 2
    assert summary["resolved_rate"] == pytest.approx(2 / 3)
    assert summary["pass_at_k"] == {"1": pytest.approx(2 / 3), "2": pytest.approx(2 / 3)}
    assert summary["failure_modes"]["resolved"] == 4
    assert summary["failure_modes"]["unresolved"] == 2
    assert summary["by_category"]["text-processing"]["resolved_rate"] == 1.0
    assert summary["by_category"]["file-operations"]["resolved_rate"] == 0.0
    want = {}
    for t in tasks[:3]:
        want[t.difficulty or "unknown"] = want.get(t.difficulty or "unknown", 0) + 2
    assert {d: g["trials"] for d, g in summary["by_difficulty"].items()} == want
    # summary numbers match trials.jsonl
    assert summary["resolved_rate"] == pytest.approx(np.mean([r["resolved"] for r in done]))
    assert summary["avg_reward"] == pytest.approx(np.mean([r["reward"] for r in done]))
    assert summary["goal_progress"] == pytest.approx(np.mean([r["goal_frac"] for r in done]))
    assert all(r["goal_frac"] == 1.0 for r in done if r["resolved"])
    assert summary["goal_progress"] < 1.0  # the do-nothing trials pass no goal assertion
    assert summary["turns_mean"] == pytest.approx(np.mean([r["turns"] for r in done]))
    assert summary["tool_calls_mean"] == pytest.approx(np.mean([r["tool_calls"] for r in done]))
    assert summary["tokens_mean"] == pytest.approx(np.mean([r["tokens"] for r in done]))
    again = summarize(rows, label="oracle-test", harness="tools", attempts=2,
                      duration_s=summary["duration_s"])
    # a pure function of the rows, but for the scale the trials were scored on
    assert again == {k: v for k, v in summary.items() if k != "reward_scale"}
    assert summary["reward_scale"] == {"value": 5, "source": "test"}
    assert "Dense reward = passed assertions / 5 (test)" in (out / "summary.md").read_text()
    md = (out / "summary.md").read_text()
    assert "pass@2" in md and "broken-build" in md and "needs-internet" in md
    assert "| needs the internet | 1 |" in md and "| image build failed | 1 |" in md

    # segments: they concatenate to the decoded sequence; the trained ones are the outputs
    for r in done:
        sample = Sample.from_npz(out / "samples" / f"{r['task_id']}--attempt{r['attempt']}.npz")
        assert sample.metadata["task_id"] == r["task_id"] and sample.reward == r["reward"]
        whole = tok.decode(sample.tokens.tolist(), skip_special_tokens=False)
        assert "".join(s["text"] for s in r["segments"]) == whole
        assert len(sample.tokens) == r["tokens"] and int(sample.loss_mask.sum()) == \
            r["sampled_tokens"]
        trained = [s["text"] for s in r["segments"] if s["trained"]]
        assert len(trained) == r["turns"]
        assert all(t in engine.outputs for t in trained)
        want = scripts.get(r["instruction"], [])
        assert trained == [render_tool_call(c) + IM_END for c in want] + [FINAL_ANSWER + IM_END]
        assert not r["segments"][0]["trained"] and r["instruction"].strip()[:40] in \
            r["segments"][0]["text"]
    assert len(list((out / "samples").glob("*.npz"))) == 6
    assert not (out / "trials.jsonl.partial").exists()


def test_evaluate_terminus_harness(docker_backend, tok, tmp_path):
    task = load_task(SEED / "count-log-errors")
    engine = KeyedEngine(tok, {task.instruction: [SOLVE]}, harness="terminus")
    summary = evaluate([task], engine, tok, TrialSite(docker_backend, scale=GlobalScale(5, "test"),
                                                      concurrency=1),
                       label="terminus-test", attempts=1, harness="terminus",
                       episode=EpisodeSettings(temperature=0.0, max_new_tokens=2048,
                                               max_turns=10, timeout_s=300.0), out_dir=tmp_path)
    (row,) = read_trials(tmp_path / "trials.jsonl")
    assert summary["harness"] == "terminus" and summary["resolved_rate"] == 1.0
    assert row["harness"] == "terminus" and row["failure_mode"] == "resolved"
    assert row["finish"] == "done" and row["turns"] == 3 and row["tool_calls"] == 1
    assert row["commands"][0]["command"] == SOLVE and "TOTAL" in row["commands"][0]["output"]
    trained = [s["text"] for s in row["segments"] if s["trained"]]
    assert len(trained) == 3 and '"task_complete": true' in trained[-1]


@pytest.mark.slow
def test_eval_job_end_to_end(docker_backend, tmp_path):
    workdir = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "experiments" / "run.py"),
           "--config", str(ROOT / "configs" / "eval.py") + ":smoke", "--workdir", str(workdir),
           "--config.tasks", str(SEED), "--config.rollouts.engine", "embedded",
           "--config.rollouts.system_prompt", "Use bash.", "--config.eval.max_tokens", "1280",
           "--config.rollouts.engine_batch", "2", "--config.rollouts.max_new_tokens", "8",
           "--config.rollouts.max_turns", "2", "--config.eval.attempts", "1"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_trials(workdir / "trials.jsonl")
    summary = json.loads((workdir / "summary.json").read_text())
    assert {r["task_id"] for r in rows} == {"count-log-errors", "organize-files"}
    assert summary["label"] == "base" and summary["trials"] == 2 and summary["tasks"] == 2
    for r in rows:
        assert r["status"] == "done" and r["harness"] == "tools"
        assert 1 <= r["turns"] <= 2 and r["sampled_tokens"] <= 16
        assert r["failure_mode"] in ("unresolved", "turn_limit", "resolved")
        assert any(s["trained"] for s in r["segments"])
    assert "# Evaluation: base" in (workdir / "summary.md").read_text()
    assert len(list((workdir / "samples").glob("*.npz"))) == 2
    # stdout is a pipe here, as under tee or CI: progress comes as plain lines
    assert "[progress] base trials (tools): 2/2 (100%)" in proc.stdout


@pytest.mark.slow
def test_an_evaluation_that_runs_nothing_fails_and_says_why(docker_backend, tmp_path):
    """Every task needs the internet and the sandbox has none: the job exits non-zero, and
    its last lines say how many tasks were skipped, why, and which key changes that."""
    tasks = tmp_path / "tasks"
    _copy_task(SEED / NOTHING_TASK, tasks / "online-only",
               toml_sub=("allow_internet = false", "allow_internet = true"))
    cmd = [sys.executable, str(ROOT / "experiments" / "run.py"),
           "--config", str(ROOT / "configs" / "eval.py") + ":smoke", "--workdir",
           str(tmp_path / "run"), "--config.tasks", str(tasks),
           "--config.rollouts.engine", "embedded", "--config.task_filter", ""]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "WARNING: skipped 1 of 1 tasks (1 needs the internet)" in proc.stderr
    assert "--config.internet_tasks=run" in proc.stderr
    assert "ERROR: evaluated no task of 1" in proc.stderr


@pytest.mark.slow
def test_load_policy_from_checkpoint_and_hf(tmp_path):
    """The job's policy sources: a training run's checkpoints/ (its actor, latest or a given
    step), an HF safetensors dir, or the seeded random init. A checkpoint's run's dense-reward
    scale (recorded by its live rollouts) is the scale its evaluation scores on."""
    import jax
    from flax import nnx

    from configs.eval import get_config
    from t1jax.checkpoint import Checkpointer
    from t1jax.jobs import UsageError
    from t1jax.jobs.eval import _recorded_scale, load_policy
    from t1jax.model.hf_io import export_hf

    def params(model):
        return jax.tree.leaves(nnx.split(model, nnx.Param)[1])

    config = get_config()
    with config.unlocked():  # a smaller model: each build compiles
        config.model.num_hidden_layers, config.model.num_experts = 2, 4
    base, label = load_policy(config)
    assert label == "base"
    graphdef, base_params = nnx.split(base, nnx.Param)
    other_params = jax.tree.map(lambda x: x + 1.0, base_params)  # "a later training step"
    with Checkpointer(tmp_path / "checkpoints", async_save=False) as ckpt:
        ckpt.save(2, {"actor": base_params}, {"step": 2})
        ckpt.save(4, {"actor": other_params}, {"step": 4, "source": {"reward_scale": 6.0}})
    with config.unlocked():
        config.seed = 7  # the init is overwritten by what is loaded
        config.policy.checkpoint = str(tmp_path / "checkpoints")
        config.policy.step = 3
    with pytest.raises(UsageError, match="step 3"):
        load_policy(config)
    with config.unlocked():
        config.policy.step = -1
    latest, label = load_policy(config)
    assert label == "step_0004"
    assert _recorded_scale(config).value == 6.0
    with config.unlocked():
        config.policy.step = 2  # no live rollouts recorded a scale: the tasks' own
        assert _recorded_scale(config) is None
        config.policy.step, config.verifier.global_scale = -1, 4.0  # fixed by hand: that one
        assert _recorded_scale(config) is None
        config.verifier.global_scale = 0.0
    assert all(np.array_equal(a, b) for a, b in zip(params(latest),
                                                    jax.tree.leaves(other_params)))
    export_hf(latest, tmp_path / "hf")
    with config.unlocked():
        config.policy.checkpoint = ""
        config.init.hf_path = str(tmp_path / "hf")
    from_hf, label = load_policy(config)
    assert label == "hf"
    assert all(np.allclose(a, b) for a, b in zip(params(from_hf),
                                                 jax.tree.leaves(other_params)))


def test_failure_mode_names_the_budget_that_ended_the_trial():
    from types import SimpleNamespace

    from t1jax.rollout.eval_summary import FAILURE_MODES, failure_mode
    unsolved = SimpleNamespace(solved=False, tampered=False, assertions=[1], failed=False)
    solved = SimpleNamespace(solved=True, tampered=False, assertions=[1], failed=False)
    for finish, mode in (("timeout", "agent_timeout"), ("turns", "turn_limit"),
                         ("context", "context_exhausted"), ("sandbox_limit", "sandbox_limit"),
                         ("done", "unresolved")):
        assert failure_mode(finish, unsolved) == mode and mode in FAILURE_MODES
        assert failure_mode(finish, solved) == "resolved"  # solved within its budget counts


@pytest.mark.slow
def test_a_seeded_evaluation_repeats_itself(docker_backend, tok, tmp_path):
    """evaluate(seed=...) gives each trial's i-th turn call_seed(seed, task, attempt, i): two
    runs with one seed write the same trials (sampled ids, commands, verdicts) although their
    concurrent trials share the engine's batches in whatever order the threads reach it; a
    second seed draws other samples. What XLA on CPU guarantees and this relies on: one compiled
    program on the same inputs gives the same bits, and the embedded engine pads every batch to
    fixed shapes, so a row's result does not depend on the other rows of its batch."""
    from flax import nnx

    from configs.model import tiny
    from t1jax.model.config import model_config_from
    from t1jax.model.transformer import CausalLM
    from t1jax.rollout.batching import embedded_engine
    model = CausalLM(model_config_from(tiny.get_config().model), nnx.Rngs(0))
    engine = embedded_engine(model, max_batch=4, max_len=1024)
    tasks = [load_task(SEED / name) for name in (ORACLE_TASKS[0], NOTHING_TASK)]

    def run(seed, name):
        evaluate(tasks, engine, tok, TrialSite(docker_backend, scale=GlobalScale(5, "test")),
                 label=name, attempts=2, seed=seed,
                 episode=EpisodeSettings(temperature=1.0, max_new_tokens=12, max_turns=2,
                                         max_tokens=1024, system_prompt="Use bash."),
                 out_dir=tmp_path / name)
        rows = read_trials(tmp_path / name / "trials.jsonl")
        return [(r["task_id"], r["attempt"], r["segments"], r.get("commands"), r.get("reward"))
                for r in rows]

    first, again, other = run(7, "first"), run(7, "again"), run(8, "other")
    assert len(first) == 4 and first == again
    assert [row[2] for row in other] != [row[2] for row in first]
    assert json.loads((tmp_path / "first" / "summary.json").read_text())["sampling_seed"] == 7


class VanishingBackend:
    """The real Docker backend, except that the first `vanish` sandboxes it creates are
    removed behind the trial's back (what CI's daemon did to four trials of one evaluation)."""

    def __init__(self, backend, vanish: int):
        self.backend, self.vanish = backend, vanish

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def create(self, spec):
        sandbox = self.backend.create(spec)
        if self.vanish > 0:
            self.vanish -= 1
            sandbox.container.remove(force=True)
        return sandbox


@pytest.mark.parametrize("vanish", [1, 5])
def test_a_trial_whose_sandbox_vanished_is_played_again(docker_backend, tok, tmp_path, vanish):
    """A failure outside the policy is no verdict on it: the trial is played again (up to
    INFRA_ATTEMPTS tries); one that keeps failing is an "infra_error": counted among the
    failure modes, named in summary.md, excluded from the rates, never the policy's
    agent_error."""
    from t1jax.rollout.evaluate import INFRA_ATTEMPTS
    task = load_task(SEED / ORACLE_TASKS[0])
    engine = KeyedEngine(tok, {task.instruction: oracle_commands(task)[0]})
    summary = evaluate([task], engine, tok, TrialSite(VanishingBackend(docker_backend, vanish),
                                                      scale=GlobalScale(5, "test"),
                                                      concurrency=1),
                       label="vanish", attempts=1, harness="tools",
                       episode=EpisodeSettings(temperature=0.0, max_new_tokens=2048,
                                               max_turns=20, timeout_s=300.0), out_dir=tmp_path)
    [row] = read_trials(tmp_path / "trials.jsonl")
    failures = min(vanish, INFRA_ATTEMPTS)
    assert len(row["infra_failures"]) == failures, row["infra_failures"]
    assert all("SandboxError" in why or "NotFound" in why for why in row["infra_failures"])
    if vanish < INFRA_ATTEMPTS:
        assert row["resolved"] and row["failure_mode"] == "resolved" and row["reward"] == 1.0
    else:
        assert not row["resolved"] and row["failure_mode"] == "infra_error"
        assert summary["failure_modes"]["infra_error"] == 1
        assert summary["failure_modes"]["agent_error"] == 0
        assert summary["trials"] == 0 and summary["tasks"] == 0  # nothing scored
        assert [x["task_id"] for x in summary["excluded"]] == [task.task_id]
        assert "Excluded trials" in (tmp_path / "summary.md").read_text()


def test_a_prompt_over_the_agents_budget_is_a_named_outcome(docker_backend, tok, tmp_path):
    """constraints-scheduling's shape: the instruction alone is over the agent's context
    budget. The trial is not a silent 0: its failure mode says so, and summary.md names the
    task and the prompt's size (it is scored: the agent never acted)."""
    task = load_task(SEED / ORACLE_TASKS[0])
    engine = KeyedEngine(tok, {task.instruction: oracle_commands(task)[0]})
    summary = evaluate([task], engine, tok, TrialSite(docker_backend, scale=GlobalScale(5, "test"),
                                                      concurrency=1),
                       label="short", attempts=1, harness="tools", episode=EpisodeSettings(
                           max_new_tokens=64, max_turns=2, max_tokens=64, timeout_s=60.0),
                       out_dir=tmp_path)
    [row] = read_trials(tmp_path / "trials.jsonl")
    assert row["failure_mode"] == "prompt_over_budget" and row["finish"] == "prompt", row
    assert summary["failure_modes"]["prompt_over_budget"] == 1 and summary["trials"] == 1
    assert "does not fit max_tokens 64" in summary["prompt_over_budget"][task.task_id]
    text = (tmp_path / "summary.md").read_text()
    assert "Prompts over the agent's context budget" in text and task.task_id in text
