"""SFT data from oracles: solve.sh splitting on tricky scripts, the OracleEngine through the real
agent loop on real Docker sandboxes of seed tasks (resolved, loss mask exactly on the assistant
tool calls, TITO audit clean), rollout filtering, and the .npz dataset round trip.
"""

from __future__ import annotations

import subprocess
import uuid

import numpy as np
import pytest

from t1jax.rl.sft_data import filter_rollouts
from t1jax.rollout.agent import run_agent_episode
from t1jax.rollout.harness import RolloutError
from t1jax.rollout.chat import IM_END, parse_tool_calls, render_tool_call
from t1jax.rollout.engine import SamplingParams
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.oracle_data import (FINAL_ANSWER, OracleEngine, oracle_commands,
                                       oracle_samples, solution_commands, split_solution,
                                       unfaithful_constructs)
from t1jax.rollout.sample import Sample, load_samples, save_samples
from t1jax.rollout.fan_out import Images
from t1jax.rollout.trial import TrialSite
from t1jax.tasks.pool import default_pool_dir, load_pool
from t1jax.verify.reward import pool_scale

LAYERS, K = 3, 2
TASKS = ("count-log-errors", "env-file-templating", "git-hooks-precommit")

TRICKY = r"""#!/bin/bash
# build the report
set -euo pipefail

cd /app/data
cat > notes.txt <<'EOF'
# not a comment: a heredoc line

if this is text; then
EOF
if [ -f notes.txt ]; then
  # a comment inside a block stays
  echo yes
fi
for f in *.txt; do
  wc -l "$f"
done
echo one \
  two \
  three
greet() {
  echo "hi $1"
}
greet you   # trailing comment
python3 - <<PY
print("x")
PY
"""


@pytest.fixture(scope="module")
def pool():
    return {t.task_id: t for t in load_pool(default_pool_dir()).tasks}


# -- splitting -----------------------------------------------------------------------------------
def test_split_tricky_script():
    cmds = solution_commands(TRICKY)
    assert cmds == [
        "cd /app/data",
        "cat > notes.txt <<'EOF'\n# not a comment: a heredoc line\n\nif this is text; then\nEOF",
        "if [ -f notes.txt ]; then\n  # a comment inside a block stays\n  echo yes\nfi",
        'for f in *.txt; do\n  wc -l "$f"\ndone',
        "echo one \\\n  two \\\n  three",
        'greet() {\n  echo "hi $1"\n}',
        "greet you   # trailing comment",
        'python3 - <<PY\nprint("x")\nPY',
    ]
    for c in cmds:  # each is a complete command on its own
        assert subprocess.run(["bash", "-n"], input=c + "\n", text=True).returncode == 0


def test_split_runs_like_the_script_in_a_persistent_shell(tmp_path):
    """cd then a relative command: one persistent shell running the commands one by one ends
    in the same state as the script."""
    script = ("#!/bin/bash\nset -e\nmkdir -p a/b\ncd a\nx=5\ncd b\n"
              "echo \"$x\" > out.txt\nls >> out.txt\n")
    cmds = solution_commands(script)
    assert cmds == ["mkdir -p a/b", "cd a", "x=5", "cd b", 'echo "$x" > out.txt',
                    "ls >> out.txt"]
    stdin = "".join(f"eval {_q(c)} </dev/null\n" for c in cmds)
    subprocess.run(["bash"], input=stdin, text=True, cwd=tmp_path, check=True)
    assert (tmp_path / "a" / "b" / "out.txt").read_text() == "5\nout.txt\n"


def _q(text):
    return "'" + text.replace("'", "'\\''") + "'"


def test_unfaithful_scripts_stay_whole(tmp_path):
    script = "#!/bin/bash\nset -e\n[ -d /nope ] || { echo missing; exit 1; }\necho after\n"
    assert unfaithful_constructs(script) == ["exit"]
    cmds, why = split_solution(script)
    assert why == ["exit"] and len(cmds) == 1
    assert cmds[0].startswith("cat > /tmp/solve.sh <<'T1JAX_SOLVE_EOF'\n#!/bin/bash\n")
    res = subprocess.run(["bash", "-c", cmds[0].replace("/tmp/solve.sh",
                                                        str(tmp_path / "s.sh"))],
                         capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout == "missing\n"  # exit kept its script meaning
    for s, name in (("trap 'rm -f x' EXIT\necho\n", "trap"), ('d=$(dirname "$0")\n', "$0"),
                    ("exec > log.txt\n", "exec")):
        assert name in unfaithful_constructs(s)
    # literal to this shell: in a heredoc, in single quotes, in comments
    ok = ("cat > r.sh <<'S'\nexit 3\ntrap '' INT\nS\nawk '{ print $0; exit }' f\n"
          "bash -c 'exit 0'  # don't exit\n")
    assert unfaithful_constructs(ok) == []
    assert len(solution_commands(ok)) == 3


def test_split_rejects_broken_script():
    with pytest.raises(ValueError, match="incomplete command"):
        split_solution("echo a\nif true; then\n  echo b\n", "task x: solve.sh")


@pytest.mark.slow
def test_every_seed_solution_splits(pool):
    for task in pool.values():
        cmds, why = oracle_commands(task)
        assert cmds, task.task_id
        assert (len(cmds) == 1) if why else True


# -- the engine ----------------------------------------------------------------------------------
def test_oracle_engine_contract(tok):
    eng = OracleEngine(tok, ["ls -la", "echo 'hi \"there\"'"], num_layers=LAYERS, top_k=K)
    params = SamplingParams(max_new_tokens=512)
    prompt = [1, 2, 3]
    for i, cmd in enumerate(["ls -la", "echo 'hi \"there\"'", None]):
        (res,) = eng.generate([prompt], params)
        text = render_tool_call(cmd) if cmd else FINAL_ANSWER
        assert res.output_ids == tok.encode(text + IM_END, add_special_tokens=False).ids
        assert res.output_ids[-1] == tok.token_to_id(IM_END) and res.finish_reason == "stop"
        assert res.routed_experts.shape == (len(prompt) + len(res.output_ids) - 1, LAYERS, K)
        assert (res.routed_experts == -1).all() and set(res.output_logprobs) == {0.0}
        calls, errors = parse_tool_calls(tok.decode(res.output_ids, skip_special_tokens=False))
        assert calls == ([cmd] if cmd else []) and not errors
        prompt = prompt + res.output_ids + [7]
    with pytest.raises(RolloutError, match="after the final answer"):
        eng.generate([prompt], params)
    with pytest.raises(RolloutError, match="turn 0 needs"):
        OracleEngine(tok, ["echo " + "x" * 400], num_layers=1, top_k=1).generate(
            [[1]], SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="round-trip"):
        OracleEngine(tok, [f"echo {IM_END}"], num_layers=1, top_k=1)


# -- real sandboxes ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env(docker_backend, pool):
    run_id = f"test-sft-{uuid.uuid4().hex[:8]}"
    yield docker_backend, run_id
    docker_backend.reap(run_id)


def check_sample(sample, task, tok):
    commands, _ = oracle_commands(task)
    meta = sample.metadata
    assert meta["verifier"]["solved"] and sample.reward > 0
    assert meta["finish"] == "done" and meta["turns"] == len(commands) + 1
    assert meta["tool_calls"] == len(commands)
    # loss mask: exactly the assistant turns (tool calls, final answer, each closed by im_end)
    want = [render_tool_call(c) + IM_END for c in commands] + [FINAL_ANSWER + IM_END]
    mask = sample.loss_mask.astype(bool)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    spans = list(zip(edges[::2], edges[1::2]))
    got = [tok.decode(sample.tokens[a:b].tolist(), skip_special_tokens=False) for a, b in spans]
    assert got == want
    assert np.flatnonzero(mask)[0] >= meta["prompt_len"]
    assert sample.routes.shape == (len(sample.tokens), LAYERS, K) and (sample.routes == -1).all()
    assert not sample.rollout_logprobs.any()


@pytest.mark.slow
def test_oracle_episode_real_sandbox(tok, pool, env):
    """The agent loop itself with the OracleEngine (TITO audit checked), then oracle_samples."""
    backend, run_id = env
    from t1jax.sandbox.backend import SandboxSpec
    from t1jax.sandbox.base import Limits
    from t1jax.rollout.trial import task_limits
    task = pool["count-log-errors"]
    commands, _ = oracle_commands(task)
    eng = OracleEngine(tok, commands, num_layers=LAYERS, top_k=K)
    spec = SandboxSpec(image=backend.build(task), limits=task_limits(task, Limits()),
                       workdir="/app", run_id=run_id)
    with backend.create(spec) as box:
        traj = run_agent_episode(task, eng, tok, box,
                                 EpisodeSettings(max_new_tokens=4096, max_tokens=16384))
    assert traj.audit.ok and traj.finish == "done", traj.audit.errors
    assert [c.command for r in traj.records for c in r.commands] == commands
    assert all(c.exit_code == 0 for r in traj.records for c in r.commands)

    tasks = [pool[t] for t in TASKS]
    site = TrialSite(backend, run_id=run_id, scale=pool_scale(tasks), concurrency=2)
    samples, skipped = oracle_samples(tasks, site, tok, num_layers=LAYERS, top_k=K)
    assert skipped == [] and [s.metadata["task_id"] for s in samples] == list(TASKS)
    for s in samples:
        check_sample(s, pool[s.metadata["task_id"]], tok)
    assert samples[2].metadata["whole_script"] == ["exit"]  # git-hooks-precommit
    text = tok.decode(samples[0].tokens.tolist(), skip_special_tokens=False)
    assert "cd /app" in text and "sort -t: -k2,2nr -k1,1 > report.txt" in text


def test_oracle_samples_reports_skips(tok, pool, env, tmp_path):
    backend, run_id = env
    task = pool["count-log-errors"]
    import dataclasses
    broken = tmp_path / "solve.sh"
    broken.write_text("#!/bin/bash\necho nothing to see\n")
    no_solution = dataclasses.replace(task, task_id="no-solution", solution_script=None)
    wrong = dataclasses.replace(task, task_id="wrong-solution", solution_script=broken)
    site = TrialSite(backend, run_id=run_id, scale=pool_scale([task]),
                     images=Images(backend, {"wrong-solution": backend.build(task)}))
    samples, skipped = oracle_samples([no_solution, wrong], site, tok, num_layers=1, top_k=1)
    assert samples == []
    assert skipped[0][0] == "no-solution" and "no reference solution" in skipped[0][1]
    assert skipped[1][0] == "wrong-solution" and skipped[1][1].startswith("unresolved:")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # uncached, 40 image builds come first
def test_oracle_samples_whole_pool(tok, pool, env):
    backend, run_id = env
    tasks = list(pool.values())
    site = TrialSite(backend, run_id=run_id, scale=pool_scale(tasks))
    samples, skipped = oracle_samples(tasks, site, tok, num_layers=1, top_k=1)
    assert len(samples) + len(skipped) == len(tasks)
    assert not skipped, skipped


# -- filtering and storage -----------------------------------------------------------------------
def _sample(task_id, attempt, reward, solved, mask=(0, 1, 1)):
    n = len(mask)
    return Sample(tokens=np.arange(n), loss_mask=mask, rollout_logprobs=np.zeros(n),
                  routes=np.full((n, 2, 1), -1), reward=reward,
                  metadata={"task_id": task_id, "attempt": attempt,
                            "verifier": {"solved": solved} if solved is not None else None})


def test_filter_rollouts():
    s = [_sample("b", 1, 1.0, True), _sample("a", 2, 0.5, False), _sample("a", 0, 1.0, True),
         _sample("c", 0, 0.0, None), _sample("a", 1, 0.8, True, mask=(0, 0, 0))]
    key = lambda out: [(x.metadata["task_id"], x.metadata["attempt"]) for x in out]  # noqa: E731
    assert key(filter_rollouts(s)) == [("a", 0), ("b", 1)]
    assert key(filter_rollouts(s, resolved_only=False, min_reward=0.5)) == [("a", 0), ("a", 2),
                                                                             ("b", 1)]
    assert key(filter_rollouts(s, min_reward=1.0)) == [("a", 0), ("b", 1)]
    assert key(filter_rollouts(list(reversed(s)))) == key(filter_rollouts(s))


def test_save_load_round_trip(tmp_path):
    s = [_sample("t/x", 3, 1.0, True), _sample("a", 0, 0.25, False)]
    paths = save_samples(s, tmp_path / "ds")
    assert [p.name for p in paths] == ["t_x--attempt0003.npz", "a--attempt0000.npz"]
    back = load_samples(tmp_path / "ds")
    assert [b.metadata["task_id"] for b in back] == ["a", "t/x"]
    for orig, got in zip([s[1], s[0]], back):
        for f in ("tokens", "loss_mask", "rollout_logprobs", "routes"):
            a, b = getattr(orig, f), getattr(got, f)
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert got.reward == orig.reward and got.metadata == orig.metadata
    with pytest.raises(ValueError, match="share a"):
        save_samples([s[0], s[0]], tmp_path / "dup")
    (tmp_path / "ds" / "bad.npz").write_bytes(b"junk")
    with pytest.raises(ValueError, match="bad.npz"):
        load_samples(tmp_path / "ds")
