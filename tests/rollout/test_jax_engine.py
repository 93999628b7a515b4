"""JaxEngine against the full forward: greedy ids equal a naive argmax loop that re-runs the whole
sequence, log-probs and expert routes equal the full forward's, batching (continuous, rows of
different lengths) changes nothing, and the compiled steps are reused across calls. The tests
against the full forward run on the hybrid Qwen3.5 model too (recurrent state in its linear
layers, keys and values in its attention layer).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_causal_lm
from t1jax.rollout.engine import SamplingParams
from t1jax.rollout.jax_engine import JaxEngine, sample

MAX_LEN, WIDTH = 48, 48  # WIDTH: the reference forward's fixed (padded) width
PROMPTS = [[5, 17, 300, 42, 7], [9, 1, 2], [100] * 11, [3, 4, 5, 6, 7, 8, 9], [250, 251]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def model():
    return tiny_causal_lm("qwen3_moe")


@pytest.fixture(scope="module")
def engine(model):
    return JaxEngine(model, max_batch=2, max_len=MAX_LEN, prefill_buckets=(8, 16))


@pytest.fixture(scope="module")
def any_engine(any_model):
    return JaxEngine(any_model, max_batch=2, max_len=MAX_LEN, prefill_buckets=(8, 16))


@pytest.fixture(scope="module")
def full(any_model):
    model = any_model
    """Full forward of one sequence padded to WIDTH (causal: the padding after it is unseen)."""
    graphdef, state = nnx.split(model)
    fwd = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))

    def run(seq):
        tokens = np.zeros((1, WIDTH), np.int32)
        tokens[0, :len(seq)] = seq
        out = fwd(state, jnp.asarray(tokens))
        return np.asarray(out.logits[0, :len(seq)]), np.asarray(out.routes[0, :len(seq)])
    run.moe_layers = model.model.cfg.moe_layers
    return run


def check_against_full(full, prompt, res):
    """Log-probs (at T=1, untruncated) and routes of all but the last position match."""
    seq = prompt + res.output_ids
    logits, routes = full(seq)
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    n = len(prompt)
    want = [logp[n - 1 + i, t] for i, t in enumerate(res.output_ids)]
    np.testing.assert_allclose(res.output_logprobs, want, rtol=0, atol=1e-4)
    assert res.routed_experts.dtype == np.int32
    assert res.routed_experts.shape == (len(seq) - 1, 4, 2)
    np.testing.assert_array_equal(res.routed_experts, routes[:-1])
    for layer in range(4):  # dense layers report -1, MoE layers real experts
        assert ((res.routed_experts[:, layer] >= 0) == (layer in full.moe_layers)).all()


@pytest.mark.slow
def test_greedy_equals_naive_full_forward_loop(any_engine, full):
    results = any_engine.generate(PROMPTS[:2], GREEDY)
    for prompt, res in zip(PROMPTS, results):
        seq = list(prompt)
        for _ in range(GREEDY.max_new_tokens):
            seq.append(int(np.argmax(full(seq)[0][-1])))
        assert res.output_ids == seq[len(prompt):]
        assert res.finish_reason == "length" and res.weight_version == "0"
        check_against_full(full, prompt, res)  # greedy reports log_softmax at T=1


@pytest.mark.slow
def test_sampled_logprobs_and_routes_match_full_forward(any_engine, full):
    params = [SamplingParams(temperature=1.0, max_new_tokens=8, seed=s) for s in range(3)]
    for prompt, res in zip(PROMPTS, any_engine.generate(PROMPTS[:3], params)):
        assert len(res.output_ids) == 8
        check_against_full(full, prompt, res)


@pytest.mark.slow
def test_batched_equals_one_by_one(any_engine):
    """5 prompts of lengths 2..11 through 2 slots (continuous batching, two buckets) give the
    same ids, log-probs and routes as each prompt alone."""
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=3 + i, seed=i)
              for i in range(len(PROMPTS))]
    batched = any_engine.generate(PROMPTS, params)
    for prompt, p, res in zip(PROMPTS, params, batched):
        alone = any_engine.generate([prompt], p)[0]
        assert res.output_ids == alone.output_ids
        np.testing.assert_allclose(res.output_logprobs, alone.output_logprobs, atol=1e-5)
        np.testing.assert_array_equal(res.routed_experts, alone.routed_experts)
        assert len(res.output_ids) == p.max_new_tokens and res.finish_reason == "length"


def test_stop_token_is_included_and_ends_with_stop(engine):
    ref = engine.generate([PROMPTS[0]], GREEDY)[0].output_ids
    stop = ref[2]
    cut = ref.index(stop) + 1
    res = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_new_tokens=6,
                                                       stop_token_ids=(stop, 511)))[0]
    assert res.finish_reason == "stop"
    assert res.output_ids == ref[:cut] and res.output_ids[-1] == stop
    assert res.routed_experts.shape[0] == len(PROMPTS[0]) + cut - 1


def test_length_limits(engine):
    res = engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=1, seed=0))[0]
    assert res.finish_reason == "length" and len(res.output_ids) == 1
    assert res.routed_experts.shape[0] == len(PROMPTS[1])  # the prompt only
    res = engine.generate([PROMPTS[2]], SamplingParams(max_new_tokens=1000, seed=0))[0]
    assert res.finish_reason == "length" and len(PROMPTS[2]) + len(res.output_ids) == MAX_LEN


def test_seeds_and_top_k_one(engine):
    prompt = [PROMPTS[0]]
    a, b, c = (engine.generate(prompt, SamplingParams(max_new_tokens=8, seed=s))[0]
               for s in (1, 1, 2))
    assert a.output_ids == b.output_ids and a.output_logprobs == b.output_logprobs
    assert a.output_ids != c.output_ids
    greedy = engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=8))[0]
    top1 = engine.generate(prompt, SamplingParams(top_k=1, max_new_tokens=8, seed=3))[0]
    assert top1.output_ids == greedy.output_ids
    # SGLang's semantics (the default): log_softmax(logits / T) whatever top-k kept, so at T=1
    # the greedy log-probs; the truncated ones are renormalised over one id
    np.testing.assert_allclose(top1.output_logprobs, greedy.output_logprobs, atol=1e-5)
    truncated = JaxEngine(engine.model, max_batch=2, max_len=MAX_LEN, prefill_buckets=(8, 16),
                          logprobs="truncated")
    top1 = truncated.generate(prompt, SamplingParams(top_k=1, max_new_tokens=8, seed=3))[0]
    assert top1.output_ids == greedy.output_ids
    np.testing.assert_allclose(top1.output_logprobs, 0.0, atol=1e-6)


def test_sample_truncation_logprobs():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 3))
    temp = jnp.array([1.0, 1.0, 2.0])
    top_k, top_p = jnp.array([2, -1, -1]), jnp.array([1.0, 0.7, 1.0])
    jitted = jax.jit(sample)
    for seed in range(5):
        ids, logp = jitted(logits, temp, top_k, top_p, jnp.full(3, seed, jnp.uint32),
                           jnp.zeros(3, jnp.int32))
        ids, logp = np.asarray(ids), np.asarray(logp)
        assert ids[0] in (0, 1) and ids[1] in (0, 1)  # top-k 2; nucleus 0.7 needs 0.5 + 0.3
        np.testing.assert_allclose(logp[:2], np.log(np.array([0.5, 0.3])[ids[:2]] / 0.8),
                                   rtol=1e-5)
        p2 = np.sqrt([0.5, 0.3, 0.15, 0.05])
        np.testing.assert_allclose(logp[2], np.log(p2[ids[2]] / p2.sum()), rtol=1e-5)
        full_ids, full = jitted(logits, temp, top_k, top_p, jnp.full(3, seed, jnp.uint32),
                                jnp.zeros(3, jnp.int32), jnp.ones(3, bool))
        assert (np.asarray(full_ids) == ids).all()  # the same draw, another log-prob
        whole = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2 + [p2 / p2.sum()]))
        np.testing.assert_allclose(full, whole[np.arange(3), ids], rtol=1e-5)


def test_no_recompile_within_a_bucket(engine):
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, seed=0))
    prefills, decodes = engine._prefill._cache_size(), engine._decode._cache_size()
    engine.generate([[4, 5, 6, 7, 8, 9]], SamplingParams(max_new_tokens=5, seed=0))
    assert engine._prefill._cache_size() == prefills
    assert engine._decode._cache_size() == decodes


def test_load_weights_changes_outputs_and_version(engine, model):
    """New weights (scaled copies of the old: no second model to build) change the outputs and
    the version without recompiling; loading the old ones back restores the outputs."""
    original = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))  # nnx.state is live
    before = engine.generate([PROMPTS[0]], GREEDY)[0]
    compiled = engine._prefill._cache_size(), engine._decode._cache_size()
    try:
        engine.load_weights(jax.tree.map(lambda x: x * 1.5, original), "7")
        after = engine.generate([PROMPTS[0]], GREEDY)[0]
        assert engine.weight_version == "7" and after.weight_version == "7"
        assert after.output_logprobs != before.output_logprobs
        assert (engine._prefill._cache_size(), engine._decode._cache_size()) == compiled
    finally:
        engine.load_weights(original, "0")
    again = engine.generate([PROMPTS[0]], GREEDY)[0]
    assert again.output_ids == before.output_ids and again.weight_version == "0"


def test_engine_ignores_in_place_model_updates_until_load_weights(model):
    """The engine generates with a snapshot: a train step that updates the model in place does
    not change its outputs behind weight_version's back."""
    engine = JaxEngine(model, max_batch=2, max_len=MAX_LEN, prefill_buckets=(8, 16))  # no compile
    original = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))
    before = engine.generate([PROMPTS[1]], GREEDY)[0]
    try:
        nnx.update(model, jax.tree.map(lambda x: x * 1.5, original))
        assert engine.generate([PROMPTS[1]], GREEDY)[0].output_logprobs == before.output_logprobs
    finally:
        nnx.update(model, original)


def test_rejects_bad_requests(engine):
    with pytest.raises(ValueError, match="prefill bucket"):
        engine.generate([[1] * 17], GREEDY)  # longest bucket is 16
    with pytest.raises(ValueError, match="tokens"):
        engine.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.generate([[1], [2]], [GREEDY])
    clamped = JaxEngine(engine.model, max_batch=2, max_len=MAX_LEN, prefill_buckets=(8, 64))
    assert clamped.buckets == (8, MAX_LEN)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
