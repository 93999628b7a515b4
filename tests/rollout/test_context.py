"""Context management (t1jax/rollout/context.py): episodes forced past a small per-chunk budget
under each policy, in a real Docker sandbox. Every chunk fits the budget and starts with exactly
the prompt the engine saw, the TITO audit holds in every chunk, the loss mask is on exactly the
sampled ids, routes cover every token the model ran, and the trial's reward reaches every
chunk's tokens through GAE. With the real engine (tiny random model) the trainer's forward of
each chunk reproduces the sampled log-probs. A 300-turn scripted episode completes with every
engine prompt inside the budget. The engine here is a scripted test double where a random model
could not hold a conversation (tests/rollout/test_agent.py: ScriptedEngine).
"""

from __future__ import annotations

import threading
import tracemalloc
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from configs.model.tiny import get_config
from t1jax.model.config import model_config_from
from t1jax.model.transformer import CausalLM
from t1jax.rl import ppo
from t1jax.rl.batch import pack
from t1jax.rollout import context as ctx
from t1jax.rollout.agent import run_agent_episode
from t1jax.rollout.chat import render_prefix, render_tool_call
from t1jax.rollout.engine import SeededCalls
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.jax_engine import JaxEngine
from t1jax.rollout.sample import Sample
from t1jax.rollout.tito import encode_observation

from test_agent import K, LAYERS, ScriptedEngine, env, shared_box, task  # noqa: F401

SYSTEM = "Use the bash tool."


class Recording:
    """The real engine, with the prompts it was sent kept for the checks."""

    def __init__(self, engine):
        self.engine, self.max_len, self.prompts = engine, engine.max_len, []

    def generate(self, prompts, sampling):
        self.prompts += [list(p) for p in prompts]
        return self.engine.generate(prompts, sampling)
EPISODE = EpisodeSettings(temperature=1.0, max_new_tokens=32)


def prefix_len(tok, task) -> int:
    return len(tok.encode(render_prefix(SYSTEM, task.instruction), add_special_tokens=False).ids)


def scripted(tok, task, box, policy: str, *, extra: int = 400, turns: int = 12,
             command: str = "printf 'line %s\\n' 1 2 3", max_tokens: int = 1 << 16, **kw):
    budget = prefix_len(tok, task) + extra
    kw.setdefault("reserve", 100)  # a turn here: a 39-token reply and its ~45-token output
    engine = ScriptedEngine(tok, [render_tool_call(command)], repeat_last=True)
    traj = run_agent_episode(task, engine, tok, box,
                             EPISODE.replace(max_turns=turns, max_tokens=max_tokens,
                                             system_prompt=SYSTEM,
                                             context=ctx.ContextPolicy(budget, policy, **kw)))
    return engine, traj, budget


def chunks(traj) -> list[tuple[int, int]]:
    ends = [*traj.chunk_starts[1:], len(traj.tokens)]
    return list(zip(traj.chunk_starts, ends))


def check_consistent(traj, engine_prompts, budget: int, layers: int = LAYERS, k: int = K):
    spans = chunks(traj)
    assert all(0 < end - start <= budget for start, end in spans), spans
    assert traj.audit.ok, traj.audit.errors
    # every engine prompt is the start of its chunk, in order: the chunk holds what it saw;
    # a chunk's first prompt (a compaction's rewrite) is context only, never trained
    at, first, prev = -1, {}, None
    for prompt in engine_prompts:
        same_chunk = prev is not None and prompt[:len(prev)] == prev  # extends the last prompt
        if not same_chunk:
            at += 1
        assert at < len(spans), "more compactions than chunks"
        start = spans[at][0]
        assert traj.tokens[start:start + len(prompt)] == prompt, f"chunk {at} is not what its " \
                                                                 f"engine call saw"
        first.setdefault(at, len(prompt))
        prev = prompt
    assert sorted(first) == list(range(len(spans))), "a chunk no engine call started"
    for (start, _), n in zip(spans, (first[i] for i in range(len(spans)))):
        assert not any(traj.loss_mask[start:start + n])
    # the loss mask is on exactly the sampled ids, which carry their sampling log-probs
    assert sum(traj.loss_mask) == sum(r.sampled for r in traj.records)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)
    # routes: one row per token; in each chunk every token the model ran has its experts
    assert traj.routes.shape == (len(traj.tokens), layers, k)
    for start, end in spans:
        ran = (traj.routes[start:end] >= 0).all(axis=(1, 2))
        if layers > 1 and (traj.routes[start:end, 0] == -1).all():  # a dense first layer
            ran = (traj.routes[start:end, 1:] >= 0).all(axis=(1, 2))
        m = int(np.argmin(ran)) if not ran.all() else end - start
        assert ran[:m].all() and not ran[m:].any() and end - start - m <= 2, (start, end, m)


def reward_reaches_every_chunk(traj, reward: float = 0.75):
    sample = Sample(traj.tokens, traj.loss_mask, traj.logprobs, traj.routes, reward, {},
                    chunk_starts=traj.chunk_starts)
    length = 1 << int(np.ceil(np.log2(len(traj.tokens))))
    packed = pack([sample], buckets=[length], num_layers=traj.routes.shape[1],
                  top_k=traj.routes.shape[2])
    batch, used = packed.batch, packed.placements[0][3]  # the tail past the last sample is cut
    _, returns = ppo.gae(jnp.asarray(batch.rewards), jnp.zeros(batch.shape),
                         jnp.asarray(batch.loss_mask), jnp.asarray(batch.trial_ids), 1.0, 1.0)
    returns, mask = np.asarray(returns)[0], batch.loss_mask[0] > 0
    for start, end in chunks(traj):
        sampled = mask[start:end]
        assert sampled.any() and np.allclose(returns[start:end][sampled], reward)
        end = min(end, used)
        assert (batch.positions[0, start:end] == np.arange(end - start)).all()
        assert len(set(batch.segment_ids[0, start:end])) == 1
    assert len(set(batch.segment_ids[0, :used])) == len(traj.chunk_starts)
    # the same trial in rows of its longest chunk (the trainer splits it at chunk boundaries):
    # the links carry the reward back to every chunk in every row
    row_len = 1 << int(np.ceil(np.log2(max(end - start for start, end in chunks(traj)))))
    if row_len < length:
        packed = pack([sample], buckets=[row_len], num_layers=traj.routes.shape[1],
                      top_k=traj.routes.shape[2])
        b = packed.batch
        assert len(packed.placements) > 1 and (b.continues_at >= 0).any()
        _, returns = ppo.gae(jnp.asarray(b.rewards), jnp.zeros(b.shape),
                             jnp.asarray(b.loss_mask), jnp.asarray(b.trial_ids), 1.0, 1.0,
                             jnp.asarray(b.continues_at))
        np.testing.assert_allclose(np.asarray(returns)[b.loss_mask > 0], reward, rtol=1e-6)
        assert int((b.loss_mask > 0).sum()) == int((batch.loss_mask > 0).sum())


# -- the policies --------------------------------------------------------------------------------

def test_stop_ends_the_episode_at_the_budget(tok, task, shared_box):
    engine, traj, budget = scripted(tok, task, shared_box, "stop")
    assert traj.finish == "context" and traj.chunk_starts == [0] and traj.compactions == 0
    assert 1 < traj.turns < 12 and len(traj.tokens) <= budget
    check_consistent(traj, engine.prompts, budget)


def test_elide_replays_the_turns_with_old_outputs_stubbed(tok, task, shared_box):
    engine, traj, budget = scripted(tok, task, shared_box, "elide")
    assert traj.finish == "turns" and traj.turns == 12 and traj.compactions >= 2
    check_consistent(traj, engine.prompts, budget)
    reward_reaches_every_chunk(traj)
    second = traj.tokens[traj.chunk_starts[1]:traj.chunk_starts[2]]
    text = tok.decode(second, skip_special_tokens=False)
    assert "[output elided: " in text and "line 3" in text  # newest output kept whole
    reply = tok.encode(render_tool_call("printf 'line %s\\n' 1 2 3"),
                       add_special_tokens=False).ids  # replayed verbatim, as ids
    assert sum(second[i:i + len(reply)] == reply for i in range(len(second))) >= 2


def test_elide_drops_the_oldest_turns_when_even_stubs_do_not_fit(tok, task, shared_box):
    engine, traj, budget = scripted(tok, task, shared_box, "elide", turns=40, extra=250,
                                    replay_fraction=1.0)
    assert traj.turns == 40 and traj.finish == "turns"
    check_consistent(traj, engine.prompts, budget)
    last = tok.decode(traj.tokens[traj.chunk_starts[-1]:], skip_special_tokens=False)
    assert "earlier turns omitted to save context" in last


def test_summary_asks_the_policy_and_continues_from_its_words(tok, task, shared_box):
    engine, traj, budget = scripted(tok, task, shared_box, "summary", summary_tokens=40)
    summaries = [r for r in traj.records if r.summary]
    assert traj.compactions >= 1 and len(summaries) >= traj.compactions
    assert traj.turns == 12 and traj.turns == sum(not r.summary for r in traj.records)
    check_consistent(traj, engine.prompts, budget)
    reward_reaches_every_chunk(traj)
    first = tok.decode(traj.tokens[:traj.chunk_starts[1]], skip_special_tokens=False)
    assert ctx.SUMMARY_REQUEST in first  # asked in the chunk that filled up ...
    second = tok.decode(traj.tokens[traj.chunk_starts[1]:], skip_special_tokens=False)
    assert ctx.SUMMARY_HEADER in second and "printf" in second  # ... answered in the next
    # which shows again the output the summary was written from
    assert ctx.LAST_OUTPUT in second and "line 3" in second.split(ctx.LAST_OUTPUT)[1]
    assert summaries[0].commands == []  # a summary's tool calls do not run


def _stubbed_outputs(tok, traj) -> int:
    return sum(tok.decode(traj.tokens[a:b], skip_special_tokens=False).count("[output elided")
               for a, b in chunks(traj))


def test_the_automatic_reserve_leaves_room_for_the_largest_output(tok, task, shared_box):
    """With outputs much longer than a reply, a reserve of the reply budget alone fills a chunk
    so far that the next output and the summary request no longer fit (the summary turn then
    sees only a stub); the automatic reserve (reply + largest output) compacts a turn earlier."""
    command = "seq 100000 100015"  # 139 tokens of output per turn, the reply 35
    runs = {}
    for reserve in (EPISODE.max_new_tokens, 0):
        engine, traj, budget = scripted(tok, task, shared_box, "summary", extra=600, turns=12,
                                        command=command, reserve=reserve, summary_tokens=40)
        check_consistent(traj, engine.prompts, budget)
        assert traj.compactions >= 1 and traj.turns == 12
        runs[reserve] = _stubbed_outputs(tok, traj)
    assert runs[EPISODE.max_new_tokens] >= 1 and runs[0] == 0, runs
    assert ctx.auto_reserve(32, 0, 1000) == 32
    assert ctx.auto_reserve(32, 120, 1000) == 152
    assert ctx.auto_reserve(32, 900, 1000) == 500  # at most half the room
    assert ctx.auto_reserve(32, 900, 40) == 32  # never less than a reply


def test_summary_prompt_shows_the_last_output_whole_as_a_stub_or_not_at_all(tok):
    out = ["x" * 400]
    whole = ctx.summary_prompt(tok, SYSTEM, "do it", "did things", out)
    stubbed = ctx.summary_prompt(tok, SYSTEM, "do it", "did things", out, limit=len(whole) - 1)
    bare = ctx.summary_prompt(tok, SYSTEM, "do it", "did things", out, limit=10)
    assert len(bare) < len(stubbed) < len(whole)
    assert "[output elided: 400 bytes]" in tok.decode(stubbed) and ctx.LAST_OUTPUT not in \
        tok.decode(bare)
    assert bare == ctx.summary_prompt(tok, SYSTEM, "do it", "did things")


@pytest.mark.parametrize("policy", ["elide", "summary"])
def test_a_carried_over_episode_with_compaction_resumes_exactly(tok, task, shared_box, policy):
    """A trial stopped at a step's end (carry-over) after its first compaction and resumed in
    the next step replays its log through the compactions and goes on: the trajectory is the
    one an uninterrupted run gives, chunk for chunk."""
    from t1jax.rollout.scheduler import (EpisodeState, TrialStopped, _LoggedEngine,
                                         _LoggedSandbox)
    policy_ = ctx.ContextPolicy(prefix_len(tok, task) + 400, policy, reserve=100,
                                summary_tokens=40)

    class StopsAfter(ScriptedEngine):
        def __init__(self, calls, stop):
            super().__init__(tok, [render_tool_call("printf 'line %s\\n' 1 2 3")],
                             repeat_last=True)
            self.calls, self.stop = calls, stop

        def generate(self, prompts, sampling):
            if len(self.prompts) + 1 == self.calls:
                self.stop.set()  # the step is full: the next turn boundary stops the trial
            return super().generate(prompts, sampling)

    def episode(engine, state, stop):
        return run_agent_episode(task, _LoggedEngine(engine, state, stop), tok,
                                 _LoggedSandbox(state),
                                 EPISODE.replace(max_turns=12, max_tokens=1 << 16,
                                                 system_prompt=SYSTEM, context=policy_))

    whole = episode(StopsAfter(0, None), EpisodeState(shared_box), threading.Event())
    first_compaction = next(i for i, r in enumerate(whole.records) if r.chunk == 1)
    state, stop = EpisodeState(shared_box), threading.Event()
    with pytest.raises(TrialStopped):
        episode(StopsAfter(first_compaction + 2, stop), state, stop)
    assert len(state.calls) == first_compaction + 2
    resumed = episode(StopsAfter(0, None), state, threading.Event())
    assert resumed.compactions == whole.compactions >= 2
    assert resumed.chunk_starts == whole.chunk_starts and resumed.tokens == whole.tokens
    assert resumed.loss_mask == whole.loss_mask and resumed.logprobs == whole.logprobs
    np.testing.assert_array_equal(resumed.routes, whole.routes)


def test_the_trial_budget_still_bounds_all_chunks(tok, task, shared_box):
    budget = prefix_len(tok, task) + 160
    engine = ScriptedEngine(tok, [render_tool_call("echo hi")], repeat_last=True)
    traj = run_agent_episode(task, engine, tok, shared_box,
                             EPISODE.replace(max_turns=50, max_tokens=3 * budget,
                                             system_prompt=SYSTEM,
                                             context=ctx.ContextPolicy(budget, "elide")))
    assert len(traj.tokens) <= 3 * budget and traj.finish in ("context", "tokens")
    check_consistent(traj, engine.prompts, budget)


def test_no_context_policy_keeps_the_single_chunk_behaviour(tok, task, shared_box):
    engine = ScriptedEngine(tok, [render_tool_call("echo hi")], repeat_last=True)
    traj = run_agent_episode(task, engine, tok, shared_box,
                             EPISODE.replace(max_turns=4, system_prompt=SYSTEM, max_tokens=4096))
    assert traj.chunk_starts == [0] and traj.compactions == 0 and traj.turns == 4
    with pytest.raises(ValueError, match="tito"):
        run_agent_episode(task, engine, tok, shared_box,
                          EPISODE.replace(tito=False, context=ctx.ContextPolicy(4096, "elide")))


# -- the pieces ----------------------------------------------------------------------------------

def test_budget_is_the_smallest_limit_and_bad_policies_are_named():
    assert ctx.context_budget(32768, 4096, 0) == 4096
    assert ctx.context_budget(32768, None, 1000) == 1000
    assert ctx.context_budget(2048, 4096, 8192) == 2048
    for bad in (dict(budget=0), dict(budget=10, policy="drop"), dict(budget=10, reserve=-1),
                dict(budget=10, replay_fraction=0.0)):
        with pytest.raises(ValueError):
            ctx.ContextPolicy(**bad)
    from configs.common import context_config

    def rollouts(**fields):
        block = context_config(ml_collections.ConfigDict())
        block.update(fields)
        return block
    assert ctx.from_config(rollouts(), 4096) is None
    policy = ctx.from_config(rollouts(compaction="elide", context_tokens=512), 4096, 2048)
    assert policy.budget == 512 and policy.policy == "elide" and policy.summary_tokens == 128
    with pytest.raises(ValueError, match="rollouts.compaction"):
        ctx.from_config(rollouts(compaction="fold"), 4096)


def test_replay_prompt_elides_then_drops_oldest(tok):
    turns = [ctx.Turn([1, 2, 3], [f"output {i} " * 20]) for i in range(6)]
    elided = ctx.elide(turns, keep=2)
    assert [t.elided for t in elided] == [True] * 4 + [False] * 2
    assert "bytes" in elided[0].observations[0] and elided[5] is turns[5]
    full, dropped = ctx.replay_prompt(tok, SYSTEM, "do it", elided, limit=10_000)
    assert dropped == 0
    body = sum(3 + len(encode_observation(tok, t.observations)) for t in elided)
    assert len(full) == len(tok.encode(render_prefix(SYSTEM, "do it"),
                                       add_special_tokens=False).ids) + body
    ids, dropped = ctx.replay_prompt(tok, SYSTEM, "do it", elided, limit=len(full) - 5,
                                     omitted=3)
    assert dropped >= 1 and len(ids) <= len(full) - 5
    assert f"{3 + dropped} earlier turns omitted" in tok.decode(ids)
    # every turn dropped: the instruction and the note remain
    ids, dropped = ctx.replay_prompt(tok, SYSTEM, "do it", elided, limit=len(full) - body + 60,
                                     omitted=3)
    assert dropped == 6 and "9 earlier turns omitted" in tok.decode(ids)
    assert ctx.replay_prompt(tok, SYSTEM, "do it", elided, limit=10) is None


# -- long and real -------------------------------------------------------------------------------

@pytest.mark.slow
def test_300_turn_episode_stays_inside_the_budget(tok, task, shared_box):
    # The trial is one training row (every chunk of it): 1k-token chunks of ~10 turns each
    engine, traj, budget = scripted(tok, task, shared_box, "elide", turns=300, extra=1200,
                                    command="echo step", max_tokens=1 << 17)
    assert traj.turns == 300 and traj.finish == "turns" and traj.tool_calls == 300
    assert max(len(p) for p in engine.prompts) <= budget  # what an engine holds is bounded
    assert traj.compactions >= 20
    check_consistent(traj, engine.prompts, budget)
    reward_reaches_every_chunk(traj)


class _Unrecorded(ScriptedEngine):
    """The scripted engine without its record of every prompt (which is the test's, not the
    agent's memory)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.prompts = _Discard()


class _Discard(list):
    def append(self, item):
        pass


class _Echo:
    def exec(self, cmd, timeout=None):
        return SimpleNamespace(output="step\n", exit_code=0, timed_out=False, truncated=False)


def test_agent_memory_grows_only_with_the_training_sample(tok, task):
    """The agent's Python heap over a whole episode, per trial token, is flat from 100 to 300
    turns and within a small factor of the compact sample's own bytes: closed chunks keep their
    arrays only (not their engine prompts or the builder's lists), and the open chunk is
    bounded by the budget. (An in-process echo sandbox: the container is not this heap.)"""
    per_token = {}
    for turns in (100, 300):
        engine = _Unrecorded(tok, [render_tool_call("echo step")], repeat_last=True)
        tracemalloc.start()
        traj = run_agent_episode(task, engine, tok, _Echo(),
                                 EPISODE.replace(max_turns=turns, max_tokens=1 << 22,
                                                 system_prompt=SYSTEM,
                                                 context=ctx.ContextPolicy(
                                                     prefix_len(tok, task) + 1200, "elide",
                                                     reserve=100)))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert traj.turns == turns and traj.compactions >= turns // 15
        sample = Sample(traj.tokens, traj.loss_mask, traj.logprobs, traj.routes, 0.0, {},
                        chunk_starts=traj.chunk_starts)
        own = sum(x.nbytes for x in (sample.tokens, sample.loss_mask, sample.rollout_logprobs,
                                     sample.routes))
        per_token[turns] = peak / len(traj.tokens)
        assert peak < 5 * own, (turns, peak, own)
    assert per_token[300] < 1.1 * per_token[100], per_token


@pytest.mark.slow
@pytest.mark.parametrize("policy, extra", [("elide", 96), ("summary", 256)])
def test_real_engine_chunks_replay_exactly_in_the_trainer_forward(tok, task, shared_box, policy,
                                                                  extra):
    cfg = get_config().model
    cfg.vocab_size = tok.get_vocab_size()
    cfg.max_position_embeddings = 2048
    model = CausalLM(model_config_from(cfg), nnx.Rngs(0))
    budget = prefix_len(tok, task) + extra  # a summary request alone is ~120 tokens here
    engine = Recording(JaxEngine(model, max_batch=1, max_len=budget, prefill_buckets=(budget,)))
    # A random model's replies are cut at max_new_tokens and answered with an error: turns
    # go on until the turn budget, compacting along the way.
    traj = run_agent_episode(
        task, SeededCalls(engine, 0, task.task_id, 0), tok, shared_box, EpisodeSettings(
            max_turns=10, max_tokens=1 << 14, system_prompt=SYSTEM, temperature=1.0,
            max_new_tokens=8, context=ctx.ContextPolicy(budget, policy, summary_tokens=8)))
    assert traj.compactions >= 1
    check_consistent(traj, engine.prompts, budget, cfg.num_hidden_layers,
                     cfg.num_experts_per_tok)
    reward_reaches_every_chunk(traj)
    tokens, mask = np.asarray(traj.tokens), np.asarray(traj.loss_mask)
    logprobs = np.asarray(traj.logprobs)
    forward = nnx.jit(lambda m, ids, pos, seg: jax.nn.log_softmax(
        m(ids, pos, seg).logits.astype(jnp.float32), axis=-1))
    for start, end in chunks(traj):
        # one compile for every chunk: each is padded to the budget as a segment of its own
        n = end - start
        ids = np.zeros((1, budget), np.int32)
        ids[0, :n] = tokens[start:end]
        seg = (np.arange(budget) >= n).astype(np.int32)[None] + 1
        lp = forward(model, jnp.asarray(ids), jnp.arange(budget)[None], jnp.asarray(seg))[0]
        mine = np.asarray(jnp.take_along_axis(lp[:n - 1], jnp.asarray(ids[0, 1:n, None]),
                                              axis=-1)[:, 0])
        sampled = mask[start + 1:end] > 0
        assert sampled.any()
        np.testing.assert_allclose(mine[sampled], logprobs[start + 1:end][sampled], atol=2e-4)
    # the trainer's packed row (all chunks, one segment each): no attention between chunks
    sample = Sample(traj.tokens, traj.loss_mask, traj.logprobs, traj.routes, 0.0, {},
                    chunk_starts=traj.chunk_starts)
    batch = pack([sample], buckets=[1 << int(np.ceil(np.log2(len(tokens))))],
                 num_layers=cfg.num_hidden_layers, top_k=cfg.num_experts_per_tok).batch
    row = jnp.asarray(batch.tokens[0])
    packed = np.asarray(jnp.take_along_axis(
        forward(model, jnp.asarray(batch.tokens), jnp.asarray(batch.positions),
                jnp.asarray(batch.segment_ids))[0, :-1], row[1:, None], axis=-1)[:, 0])
    trained = batch.loss_mask[0, 1:] > 0
    assert trained.sum() == mask.sum()  # no chunk starts on a sampled id here
    np.testing.assert_allclose(packed[trained], batch.rollout_logprobs[0, 1:][trained], atol=2e-4)
    # the same trial split over rows of one chunk's length: every row's forward still
    # reproduces the sampled log-probs, and every sampled id is trained once
    rows = pack([sample], buckets=[1 << int(np.ceil(np.log2(budget)))],
                num_layers=cfg.num_hidden_layers, top_k=cfg.num_experts_per_tok)
    b = rows.batch
    assert len(rows.placements) > 1 and int(b.loss_mask.sum()) == int(mask.sum())
    lp = np.asarray(jnp.take_along_axis(
        forward(model, jnp.asarray(b.tokens), jnp.asarray(b.positions),
                jnp.asarray(b.segment_ids))[:, :-1], jnp.asarray(b.tokens)[:, 1:, None],
        axis=-1)[..., 0])
    trained = b.loss_mask[:, 1:] > 0
    np.testing.assert_allclose(lp[trained], b.rollout_logprobs[:, 1:][trained], atol=2e-4)
