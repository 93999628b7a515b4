"""JaxEngine session prefix reuse: a multi-turn episode generated with session ids (only each
turn's new suffix prefilled) gives the same ids, log-probs and routes as full prefills, and
prompts that do not extend the retained tokens, evicted rows and new weights fall back safely.
The episode tests also run on the hybrid Qwen3.5 model, whose linear layers' recurrent state
allows reuse only when a prompt extends the whole retained row.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_causal_lm
from t1jax.rollout.engine import SamplingParams
from t1jax.rollout.jax_engine import JaxEngine

MAX_LEN = 64
BUCKETS = (8, 16, 32)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)
OBSERVATIONS = [[200, 201, 202, 203], [7, 8, 9]]


@pytest.fixture(scope="module")
def model():
    return tiny_causal_lm("qwen3_moe")


def make_engine(model):
    return JaxEngine(model, max_batch=2, max_len=MAX_LEN, prefill_buckets=BUCKETS)


def assert_same(got, want):
    assert got.output_ids == want.output_ids
    np.testing.assert_allclose(got.output_logprobs, want.output_logprobs, rtol=0, atol=1e-4)
    assert got.routed_experts.shape == want.routed_experts.shape
    np.testing.assert_array_equal(got.routed_experts, want.routed_experts)
    assert got.finish_reason == want.finish_reason


@pytest.mark.slow
def test_three_turn_episode_matches_full_prefill(any_model):
    """Two episodes side by side (greedy and sampled), three turns each: every turn after the
    first reuses its session's row (all but the never-fed last output id) and changes nothing."""
    reused, plain = make_engine(any_model), make_engine(any_model)
    prompts, params, sessions = [[5, 17, 300, 42, 7], [9, 1, 2]], [GREEDY, SAMPLED], ["a", "b"]
    expected_reuse = 0
    for turn in range(3):
        want = plain.generate(prompts, params)
        got = reused.generate(prompts, params, session_ids=sessions)
        for g, w, p in zip(got, want, prompts):
            assert_same(g, w)
            assert g.routed_experts.shape[0] == len(p) + len(g.output_ids) - 1
        assert reused.stats["reused_tokens"] == expected_reuse
        assert reused.stats["session_hits"] == 2 * turn
        expected_reuse += sum(len(p) + len(w.output_ids) - 1 for p, w in zip(prompts, want))
        obs = OBSERVATIONS[turn % 2]
        prompts = [p + w.output_ids + obs for p, w in zip(prompts, want)]
    assert reused.stats["prefilled_tokens"] < plain.stats["prefilled_tokens"]
    assert plain.stats["session_hits"] == plain.stats["reused_tokens"] == 0


@pytest.mark.slow
def test_prompts_that_do_not_extend_the_retained_tokens(any_model):
    """A prompt diverging at once is a full prefill; one diverging midway reuses the common
    prefix; one that is a prefix of the retained tokens re-prefills only its last token. With
    linear layers (no cutting a recurrent state back) the last two are full prefills too."""
    reused, plain = make_engine(any_model), make_engine(any_model)
    hybrid = bool(any_model.model.cfg.linear_layers)
    first = [5, 17, 300, 42, 7, 8]
    out = reused.generate([first], GREEDY, session_ids=["s"])[0]
    kept = first + out.output_ids[:-1]  # the tokens the row holds
    cases = [([99] + kept[1:] + [3], 0), (kept[:4] + [1, 2, 3], 0 if hybrid else 4),
             (kept[:7], 0 if hybrid else 6)]
    for prompt, reuse in cases:
        before = dict(reused.stats)
        got = reused.generate([prompt], GREEDY, session_ids=["s"])[0]
        assert_same(got, plain.generate([prompt], GREEDY)[0])
        assert reused.stats["reused_tokens"] - before["reused_tokens"] == reuse
        assert reused.stats["session_hits"] - before["session_hits"] == (reuse > 0)
        # restore the row to `kept` for the next case
        reused.generate([first], GREEDY, session_ids=["s"])


def test_eviction_and_new_weights_fall_back(model):
    """With two rows, a third session evicts the least recently used one, which then misses;
    load_weights drops every retained row."""
    reused, plain = make_engine(model), make_engine(model)
    pa, pb, pc = [1, 2, 3, 4], [10, 11, 12], [20, 21, 22, 23, 24]
    ra = reused.generate([pa], GREEDY, session_ids=["a"])[0]
    rb = reused.generate([pb], GREEDY, session_ids=["b"])[0]
    reused.generate([pc], GREEDY, session_ids=["c"])  # evicts a (older than b)
    na, nb = pa + ra.output_ids + [5], pb + rb.output_ids + [6]
    hits = reused.stats["session_hits"]
    got_b = reused.generate([nb], GREEDY, session_ids=["b"])[0]
    assert reused.stats["session_hits"] == hits + 1
    got_a = reused.generate([na], GREEDY, session_ids=["a"])[0]
    assert reused.stats["session_hits"] == hits + 1 and reused.stats["session_misses"] == 4
    assert_same(got_a, plain.generate([na], GREEDY)[0])
    assert_same(got_b, plain.generate([nb], GREEDY)[0])

    reused.load_weights(jax.tree.map(jnp.copy, nnx.state(model, nnx.Param)), "1")
    nna = na + got_a.output_ids
    got = reused.generate([nna], GREEDY, session_ids=["a"])[0]
    assert reused.stats["session_hits"] == hits + 1  # the row was dropped
    assert_same(got, plain.generate([nna], GREEDY)[0])

    assert reused._cache is not None  # "a" is retained
    reused.drop_sessions()
    assert reused._cache is None
    reused.generate([nna + [1]], GREEDY, session_ids=["a"])
    assert reused.stats["session_hits"] == hits + 1
    plain.generate([[1, 2]], GREEDY)
    assert plain._cache is None  # nothing retained: the cache is freed between calls


def test_sessions_mixed_with_plain_requests_in_one_call(model):
    """More requests than rows, some with sessions, in one call: queueing, eviction within the
    call and reuse by a later request of the same session all leave the results unchanged."""
    reused, plain = make_engine(model), make_engine(model)
    p0 = [3, 4, 5, 6, 7, 8, 9]
    r0 = reused.generate([p0], GREEDY, session_ids=["x"])[0]
    p1 = p0 + r0.output_ids + [1, 2]
    prompts = [[250, 251], p1, [9, 1, 2], [100] * 11]
    params = [GREEDY, SAMPLED, SAMPLED, GREEDY]
    got = reused.generate(prompts, params, session_ids=[None, "x", "y", None])
    for g, w in zip(got, plain.generate(prompts, params)):
        assert_same(g, w)
    assert reused.stats["session_hits"] == 1
    with pytest.raises(ValueError, match="session_ids"):
        reused.generate([[1]], GREEDY, session_ids=["a", "b"])


def test_trials_through_the_batching_engine_replay_each_route_once(model):
    """The main path (BatchingEngine over a JaxEngine, a trial's calls in its session): every
    later turn reuses its row, so the stitched routes never drift; weights published mid-trial
    (one-step-off) drop the rows, and the positions the new weights route differently are
    counted as drift, exactly, and reach the step's rollout/route_drift."""
    from t1jax.rl.metrics import sample_stats
    from t1jax.rollout.harness import RouteRecord
    from t1jax.rollout.batching import BatchingEngine
    from t1jax.rollout.engine import generate_in_session
    from t1jax.rollout.sample import Sample

    def trial(engine, publish_before=None):
        routes, prompt, calls = RouteRecord(), [5, 17, 300, 42, 7], []
        for turn in range(3):
            if turn == publish_before:
                perturbed = jax.tree.map(lambda x: x * 1.5, nnx.state(model, nnx.Param))
                engine.load_weights(perturbed, "1")
            res = generate_in_session(engine, [prompt], SAMPLED, "7/task/0")[0]
            routes.add(prompt, res)
            calls.append(res.routed_experts)
            prompt = prompt + res.output_ids + OBSERVATIONS[turn % 2]
        return routes, calls

    engine = BatchingEngine(make_engine(model))
    assert engine.takes_sessions
    routes, _ = trial(engine)
    assert routes.drift == 0 and engine.engine.stats["session_hits"] == 2

    engine = BatchingEngine(make_engine(nnx.clone(model)))  # load_weights writes its model
    routes, calls = trial(engine, publish_before=2)
    assert engine.engine.stats["session_hits"] == 1  # the publish dropped the row
    n = len(calls[1])  # rows the first two calls ran; the third re-ran all of them
    rerouted = int(np.any(calls[1] != calls[2][:n], axis=(1, 2)).sum())
    assert routes.drift == rerouted > 0

    samples = [Sample(tokens=np.arange(4), loss_mask=np.array([0, 1, 1, 0]),
                      rollout_logprobs=np.zeros(4), routes=np.zeros((4, 4, 2), np.int32),
                      reward=0.5, metadata={"route_drift": d, "logprobs": lp})
               for d, lp in ((0, "full"), (routes.drift, "truncated"))]
    stats = sample_stats(samples)
    assert stats["rollout/route_drift"] == routes.drift
    assert stats["rollout/logprobs_full_vocab"] == 0.5 and engine.logprobs == "full"
