"""The agent loop on a real Docker sandbox of the seed task `count-log-errors`: a scripted engine
solves it (verified, reward > 0), malformed calls become error observations, budgets stop the
loop, bad routes abort the rollout, samples round-trip through .npz; and the real JaxEngine
(tiny random model) runs two turns without breaking the record.
"""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pytest
from flax import nnx

from configs.model.tiny import get_config
from t1jax.model.config import model_config_from
from t1jax.model.transformer import CausalLM
from t1jax.rollout.agent import run_agent_episode
from t1jax.rollout.harness import RolloutError, truncate_middle
from t1jax.rollout.chat import IM_END, render_tool_call
from t1jax.rollout.engine import FINISH_STOP, GenerateResult
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.jax_engine import JaxEngine
from t1jax.rollout.sample import Sample, make_sample
from t1jax.rollout.trial import task_limits
from t1jax.sandbox.backend import SandboxSpec
from t1jax.sandbox.base import Limits
from t1jax.tasks.task import load_task
from t1jax.verify.reward import GlobalScale
from t1jax.verify.verifier import verify
from conftest import COUNT_LOG_SOLVE, COUNT_LOG_TASK

TASK_DIR = COUNT_LOG_TASK
LAYERS, K = 3, 2
EPISODE = EpisodeSettings(temperature=1.0, max_new_tokens=256)
SOLVE = COUNT_LOG_SOLVE


class ScriptedEngine:
    """A test double for the model: returns pre-written completions (encoded with the real
    tokenizer, closed by <|im_end|>) with fake log-probs and routes of the contract's shape."""

    weight_version = "scripted"

    def __init__(self, tok, texts, bad_routes=False, repeat_last=False, shift_routes=False,
                 incremental=False):
        self.tok, self.texts, self.bad, self.repeat = tok, list(texts), bad_routes, repeat_last
        self.shift = shift_routes  # each call routes every position differently
        self.incremental = incremental  # honour routes_from, as a fleet does
        self.prompts: list[list[int]] = []
        self.rows_sent = 0

    def generate(self, prompts, sampling):
        (prompt,) = prompts
        self.prompts.append(list(prompt))
        text = self.texts.pop(0) if len(self.texts) > 1 or not self.repeat else self.texts[0]
        ids = self.tok.encode(text, add_special_tokens=False).ids + [self.tok.token_to_id(IM_END)]
        rows = len(prompt) + len(ids) - 1 + (1 if self.bad else 0)
        routes = (np.arange(rows * LAYERS * K) % 7).reshape(rows, LAYERS, K).astype(np.int32)
        routes += (len(self.prompts) - 1) * self.shift
        start = sampling.routes_from if self.incremental else 0
        self.rows_sent += len(routes) - start
        return [GenerateResult(ids, [-0.5] * len(ids), routes[start:], FINISH_STOP,
                               self.weight_version, routes_start=start)]

    def load_weights(self, params_state, version):
        raise NotImplementedError


@pytest.fixture(scope="module")
def task():
    return load_task(TASK_DIR)


@pytest.fixture(scope="module")
def env(docker_backend, task):
    """(backend, image, a sandbox factory); every sandbox of this module is reaped at the end."""
    run_id = f"test-agent-{uuid.uuid4().hex[:8]}"
    image = docker_backend.build(task)

    def make(**limits):
        return docker_backend.create(SandboxSpec(
            image=image, limits=dataclasses.replace(task_limits(task, Limits()), **limits),
            workdir="/app", run_id=run_id))
    yield docker_backend, make, run_id
    docker_backend.reap(run_id)


@pytest.fixture(scope="module")
def shared_box(env):
    with env[1]() as box:
        yield box


def check_record(traj, engine_prompts):
    """Loss mask exactly on sampled ids, routes over every token, prompts are prefixes."""
    n = len(traj.tokens)
    assert len(traj.loss_mask) == len(traj.logprobs) == n
    assert traj.routes.shape == (n, LAYERS, K) and traj.routes.dtype == np.int32
    assert (traj.routes[-1] == -1).all()
    assert traj.audit.ok, traj.audit.errors
    want = np.zeros(n, int)
    comp_len = 0
    for prompt in engine_prompts:
        assert traj.tokens[:len(prompt)] == prompt
    for turn, off in zip(traj.records, traj.audit.relocated):
        want[off:off + turn.sampled] = 1
        comp_len += turn.sampled
    assert (np.asarray(traj.loss_mask) == want).all()
    assert sum(traj.loss_mask) == comp_len
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)


@pytest.mark.slow
def test_each_position_s_routes_are_asked_for_once(tok, task, env):
    """An engine that returns only the positions a call asks for (routes_from, a fleet's
    routed_experts_start_len) gives the same record as one that returns them all, with every
    position's routes sent once per trial (linear in its tokens, not in turns x tokens);
    nothing is compared, so no drift can be claimed (rollout/route_drift is then NaN)."""
    from t1jax.rl.metrics import sample_stats
    texts = ["Let me look.\n" + render_tool_call("ls /app/logs"), render_tool_call(SOLVE),
             "The report is written."]
    backend, make, _ = env
    trajs, engines = [], []
    for incremental in (False, True):
        engines.append(ScriptedEngine(tok, texts, incremental=incremental))
        with make() as box:
            trajs.append(run_agent_episode(task, engines[-1], tok, box,
                                           EPISODE.replace(max_tokens=8192)))
    whole, once = trajs
    assert whole.tokens == once.tokens and np.array_equal(whole.routes, once.routes)
    assert whole.route_compared > 0 and once.route_compared == 0
    assert whole.route_drift == once.route_drift == 0
    assert engines[1].rows_sent == len(engines[1].prompts[-1]) + once.records[-1].sampled - 1
    assert engines[0].rows_sent > 2 * engines[1].rows_sent  # three turns, each from 0
    stats = [sample_stats([make_sample(t, None, "t", 0)])["rollout/route_drift"]
             for t in trajs]
    assert stats[0] == 0 and np.isnan(stats[1])


@pytest.mark.slow
def test_scripted_engine_solves_task(tok, task, env):
    backend, make, run_id = env
    texts = ["Let me look.\n" + render_tool_call("ls /app/logs"),
             '<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>',
             render_tool_call(SOLVE),
             "The report is written."]
    engine = ScriptedEngine(tok, texts)
    with make() as box:
        traj = run_agent_episode(task, engine, tok, box, EPISODE.replace(max_tokens=8192))
        report = verify(task, box, backend, GlobalScale(5, "test"), run_id=run_id,
                        limits=task_limits(task, Limits()))
    assert traj.finish == "done" and traj.turns == 4 and traj.tool_calls == 2
    assert report.solved and report.reward > 0, report.log[-2000:]
    check_record(traj, engine.prompts)
    assert traj.route_drift == 0  # the scripted routes agree wherever calls overlap
    last = engine.prompts[-1]
    assert traj.routes.shape[0] == len(last) + traj.records[-1].sampled
    # Turn 1 ran `ls`; turn 2's malformed call was answered with an error, and the loop went on.
    obs1 = tok.decode(engine.prompts[1][len(engine.prompts[0]):])
    assert "backend.log" in obs1 and "[exit code: 0]" in obs1
    obs2 = tok.decode(engine.prompts[2][len(engine.prompts[1]):])
    assert "Error: tool call is not valid JSON" in obs2
    assert traj.records[1].errors and not traj.records[1].commands
    assert traj.records[2].commands[0].exit_code == 0

    sample = make_sample(traj, report, task.task_id, attempt=3)
    assert sample.token_rewards()[sample.last_response_index] == pytest.approx(report.reward)
    assert sample.token_rewards().sum() == pytest.approx(report.reward)


def test_turn_budget_stops_looping_engine(tok, task, shared_box):
    engine = ScriptedEngine(tok, [render_tool_call("echo again")], repeat_last=True)
    traj = run_agent_episode(task, engine, tok, shared_box,
                             EPISODE.replace(max_turns=3, max_tokens=8192))
    assert traj.finish == "turns" and traj.turns == 3 and traj.tool_calls == 3
    assert len(engine.prompts) == 3
    check_record(traj, engine.prompts)
    # No observation is appended after the last turn: nothing would read it.
    assert traj.tokens[-1] == tok.token_to_id(IM_END)


def test_token_budget_stops(tok, task, shared_box):
    engine = ScriptedEngine(tok, [render_tool_call("echo again")], repeat_last=True)
    traj = run_agent_episode(task, engine, tok, shared_box, EPISODE.replace(max_tokens=1400))
    assert traj.finish == "tokens" and 1 <= traj.turns < 10
    check_record(traj, engine.prompts)


def test_wall_clock_timeout_stops(tok, task, shared_box):
    engine = ScriptedEngine(tok, [render_tool_call("sleep 5; echo late")], repeat_last=True)
    traj = run_agent_episode(task, engine, tok, shared_box,
                             EPISODE.replace(max_tokens=8192, timeout_s=1.0))
    assert traj.finish == "timeout" and traj.turns == 1
    assert traj.records[0].commands[0].timed_out
    check_record(traj, engine.prompts)


@pytest.mark.parametrize("limit", ["output", "storage"])
def test_a_sandbox_budget_ends_the_episode(limit, tok, task, env):
    """Past its storage quota or its episode's output budget the episode ends as
    "sandbox_limit" (a trial that is verified and scored, not a crash)."""
    if limit == "output":
        box, cmd = env[1](episode_output_bytes=200_000), "seq 1 100000"
    else:
        box, cmd = env[1](storage_mb=16), "head -c 40000000 /dev/zero > /app/big"
    engine = ScriptedEngine(tok, [render_tool_call(cmd)], repeat_last=True)
    with box:
        traj = run_agent_episode(task, engine, tok, box,
                                 EPISODE.replace(max_turns=5, max_tokens=8192))
    assert traj.finish == "sandbox_limit" and traj.turns == 1
    assert ("storage quota of 16 MiB" if limit == "storage" else "budget of 200000") in \
        traj.records[0].limit
    assert traj.records[0].commands[0].exit_code is None
    check_record(traj, engine.prompts)


def test_routes_come_from_the_first_call_that_ran_each_position(tok, task, shared_box):
    engine = ScriptedEngine(tok, [render_tool_call("true")], repeat_last=True, shift_routes=True)
    traj = run_agent_episode(task, engine, tok, shared_box,
                             EPISODE.replace(max_turns=3, max_tokens=8192))
    check_record(traj, engine.prompts)
    base = (np.arange(traj.routes.size) % 7).reshape(traj.routes.shape)
    start, drift = 0, 0
    for call, (prompt, turn) in enumerate(zip(engine.prompts, traj.records)):
        end = len(prompt) + turn.sampled - 1  # rows this call ran
        assert (traj.routes[start:end] == base[start:end] + call).all(), call
        drift += start  # every earlier position was rerouted by this call
        start = end
    assert start == len(traj.tokens) - 1 and traj.route_drift == drift


def test_wrong_route_shape_raises(tok, task, shared_box):
    engine = ScriptedEngine(tok, [render_tool_call("echo hi")], bad_routes=True)
    with pytest.raises(RolloutError, match="routed_experts"):
        run_agent_episode(task, engine, tok, shared_box, EPISODE.replace(max_tokens=8192))


def test_sample_npz_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    n = 40
    mask = np.zeros(n, int)
    mask[20:30] = 1
    s = Sample(tokens=rng.integers(0, 500, n), loss_mask=mask,
               rollout_logprobs=-rng.random(n) * mask, routes=rng.integers(-1, 16, (n, 3, 2)),
               reward=0.75, metadata={"task_id": "t", "attempt": 2, "turns": 3,
                                      "verifier": {"solved": True, "assertions": [{"a": 1}]}})
    s.to_npz(tmp_path / "s.npz")
    back = Sample.from_npz(tmp_path / "s.npz")
    for f in ("tokens", "loss_mask", "rollout_logprobs", "routes"):
        a, b = getattr(s, f), getattr(back, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f
    assert back.reward == 0.75 and back.metadata == s.metadata
    assert back.last_response_index == 29 and back.token_rewards()[29] == np.float32(0.75)


def test_truncate_middle_keeps_head_and_tail():
    text = "HEAD" + "x" * 5000 + "TAIL"
    out, cut = truncate_middle(text, 200)
    assert cut and out.startswith("HEAD") and out.endswith("TAIL")
    assert len(out.encode()) <= 200
    assert truncate_middle("short", 200) == ("short", False)


class SeedZero:
    """Every call sampled with seed 0: the draws this test's premise was checked on."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, sampling):
        return self.engine.generate(prompts, dataclasses.replace(sampling, seed=0))

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.mark.slow
def test_real_jax_engine_two_turns(tok, task, shared_box):
    cfg = get_config().model
    cfg.vocab_size = tok.get_vocab_size()
    cfg.max_position_embeddings = 2048
    model = CausalLM(model_config_from(cfg), nnx.Rngs(0))
    engine = JaxEngine(model, max_batch=1, max_len=1536, prefill_buckets=(1280, 1536))
    traj = run_agent_episode(task, SeedZero(engine), tok, shared_box,
                             EpisodeSettings(max_turns=2, temperature=1.0, max_new_tokens=8))
    # Random ids rarely hold <|im_end|>: both replies are cut, answered with an error, and the
    # turn budget ends the episode.
    assert traj.turns == 2 and traj.finish == "turns"
    assert all(r.finish_reason == "length" and r.errors for r in traj.records)
    n = len(traj.tokens)
    assert traj.routes.shape == (n, cfg.num_hidden_layers, cfg.num_experts_per_tok)
    assert traj.audit.ok, traj.audit.errors
    assert (traj.routes[:, 0] == -1).all()  # layer 0 is dense
    ran = (traj.routes[:, 1:] >= 0).all(axis=(1, 2))
    m = int(ran.argmin())  # the tail the model never ran: the last sampled id (+ a closing im_end)
    assert ran[:m].all() and not ran[m:].any() and n - m in (1, 2)
    assert sum(traj.loss_mask) == sum(r.sampled for r in traj.records)
    assert traj.weight_versions == [engine.weight_version] * traj.turns


def test_xml_tool_calls_drive_the_shell(tok, task, shared_box):
    """tool_format="qwen3_xml" (Qwen3.5's form): the prompt describes it, an XML call runs, a
    call in the other form is answered with an error rather than run."""
    texts = [render_tool_call("echo xml-call-ran", "qwen3_xml"),
             render_tool_call("echo json-call", "qwen3_json"), "Done."]
    engine = ScriptedEngine(tok, texts)
    traj = run_agent_episode(task, engine, tok, shared_box,
                             EPISODE.replace(max_tokens=8192, tool_format="qwen3_xml"))
    assert "<function=NAME>" in tok.decode(engine.prompts[0], skip_special_tokens=False)
    assert traj.finish == "done" and traj.tool_calls == 1
    assert traj.records[0].commands[0].exit_code == 0
    assert "xml-call-ran" in tok.decode(engine.prompts[1][len(engine.prompts[0]):])
    assert traj.records[1].errors and not traj.records[1].commands
    check_record(traj, engine.prompts)
