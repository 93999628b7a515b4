"""KVCache prefill + decode against the full forward: same logits and expert routes, for rows of
different lengths, chunked prefill, a jit-compiled decode step that compiles once, and bfloat16.

The model is a random HF Qwen3-MoE with large weights (non-trivial routing, so a wrong key or
position changes the experts picked) loaded with `load_hf`; layer 1 is dense.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t1jax.model.cache import KVCache
from t1jax.model.hf_io import load_hf
from t1jax.model.transformer import CausalLM
from conftest import saved_hf_and_loaded

pytest.importorskip("torch")
pytest.importorskip("transformers")

B, S, MAX_LEN = 2, 10, 16
PROMPT = 4  # every prefill has this width and every decode step width 1: few compiles
ATOL = 1e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv")
    _, cfg, model = saved_hf_and_loaded(path)
    tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (B, S)).astype(np.int32)
    return cfg, model, tokens, path


@nnx.jit
def step(model, tokens, positions, segment_ids, cache):
    """Prefill or decode (the cache says which); one trace per shape."""
    return model(tokens, positions, segment_ids, cache=cache)


@nnx.jit
def full(model, tokens, positions, segment_ids):
    return model(tokens, positions, segment_ids)


def arange(b, start, stop):
    return np.broadcast_to(np.arange(start, stop, dtype=np.int32), (b, stop - start)).copy()


def full_forward(model, tokens):
    b, s = tokens.shape
    return full(model, jnp.asarray(tokens), jnp.asarray(arange(b, 0, s)),
                jnp.ones((b, s), jnp.int32))


def generate_like(model, cfg, tokens, prompt_len):
    """Prefill tokens[:, :prompt_len], then feed the rest one token per step (teacher-forced);
    returns logits [B, S, V], routes [B, S, L, k] and the final cache."""
    b, s = tokens.shape
    cache = KVCache.create(cfg, b, MAX_LEN)
    out = step(model, jnp.asarray(tokens[:, :prompt_len]), jnp.asarray(arange(b, 0, prompt_len)),
               jnp.ones((b, prompt_len), jnp.int32), cache)
    logits, routes, cache = [out.logits], [out.routes], out.cache
    for t in range(prompt_len, s):
        out = step(model, jnp.asarray(tokens[:, t:t + 1]), jnp.full((b, 1), t, jnp.int32),
                   jnp.ones((b, 1), jnp.int32), cache)
        logits.append(out.logits)
        routes.append(out.routes)
        cache = out.cache
    return (np.asarray(jnp.concatenate(logits, 1)), np.asarray(jnp.concatenate(routes, 1)),
            cache)


@pytest.mark.slow
def test_prefill_then_decode_matches_full_forward(setup):
    cfg, model, tokens, _ = setup
    ref = full_forward(model, tokens)
    logits, routes, cache = generate_like(model, cfg, tokens, prompt_len=PROMPT)
    np.testing.assert_allclose(logits, np.asarray(ref.logits), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(routes, np.asarray(ref.routes))
    assert logits.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(cache.lengths), [S, S])
    assert cache.max_len == MAX_LEN
    # slots past the written length stay empty
    for layer in cache.layers:
        assert (np.asarray(layer.k)[:, S:] == 0).all() and (np.asarray(layer.v)[:, S:] == 0).all()


def test_cache_create_shapes(setup):
    cfg, *_ = setup
    cache = KVCache.create(cfg, 3, 7)
    assert len(cache.layers) == cfg.num_hidden_layers
    assert cache.layers[0].k.shape == (3, 7, cfg.num_key_value_heads, cfg.head_dim)
    assert cache.layers[0].k.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(cache.lengths), [0, 0, 0])
    assert KVCache.create(cfg, 1, 4, "bfloat16").layers[0].v.dtype == jnp.bfloat16


def test_rows_with_different_prompt_lengths(setup):
    """Row 0 has a 2-token prompt, row 1 a 4-token one (right-padded with segment 0); each then
    decodes at its own position. Every row matches its own unpadded full forward (rows of a
    batch are independent, and causality makes a prefix's logits those of the whole row)."""
    cfg, model, tokens, _ = setup
    lens = [2, PROMPT]
    width, steps = PROMPT, 3
    prompt = tokens[:, :width].copy()
    seg = np.zeros((B, width), np.int32)
    for r, n in enumerate(lens):
        seg[r, :n] = 1
        prompt[r, n:] = 0  # padding ids: must not matter
    cache = KVCache.create(cfg, B, MAX_LEN)
    out = step(model, jnp.asarray(prompt), jnp.asarray(arange(B, 0, width)), jnp.asarray(seg),
               cache)
    np.testing.assert_array_equal(np.asarray(out.cache.lengths), lens)
    prefill_routes = np.asarray(out.routes)
    for r, n in enumerate(lens):
        assert (prefill_routes[r, n:] == -1).all()
    per_row_logits = [[np.asarray(out.logits[r, :n])] for r, n in enumerate(lens)]
    per_row_routes = [[prefill_routes[r, :n]] for r, n in enumerate(lens)]
    cache = out.cache
    for i in range(steps):
        pos = np.array([[n + i] for n in lens], np.int32)
        nxt = np.take_along_axis(tokens, pos, axis=1)  # each row's next token
        out = step(model, jnp.asarray(nxt), jnp.asarray(pos), jnp.ones((B, 1), jnp.int32), cache)
        cache = out.cache
        np.testing.assert_array_equal(np.asarray(cache.lengths), [n + i + 1 for n in lens])
        for r in range(B):
            per_row_logits[r].append(np.asarray(out.logits[r]))
            per_row_routes[r].append(np.asarray(out.routes[r]))
    ref = full_forward(model, tokens)
    for r, n in enumerate(lens):
        np.testing.assert_allclose(np.concatenate(per_row_logits[r]),
                                   np.asarray(ref.logits[r, :n + steps]), rtol=0, atol=ATOL,
                                   err_msg=f"row {r}")
        np.testing.assert_array_equal(np.concatenate(per_row_routes[r]),
                                      np.asarray(ref.routes[r, :n + steps]), err_msg=f"row {r}")
    # the padded row's logits do not depend on its padding ids
    other = prompt.copy()
    other[0, lens[0]:] = 7
    again = step(model, jnp.asarray(other), jnp.asarray(arange(B, 0, width)), jnp.asarray(seg),
                 KVCache.create(cfg, B, MAX_LEN))
    np.testing.assert_array_equal(np.asarray(again.logits[0, :lens[0]]),
                                  np.asarray(per_row_logits[0][0]))


def test_two_chunk_prefill_equals_one_chunk(setup):
    cfg, model, tokens, _ = setup
    n, cut = 2 * PROMPT, PROMPT
    one = step(model, jnp.asarray(tokens[:, :n]), jnp.asarray(arange(B, 0, n)),
               jnp.ones((B, n), jnp.int32), KVCache.create(cfg, B, MAX_LEN))
    first = step(model, jnp.asarray(tokens[:, :cut]), jnp.asarray(arange(B, 0, cut)),
                 jnp.ones((B, cut), jnp.int32), KVCache.create(cfg, B, MAX_LEN))
    second = step(model, jnp.asarray(tokens[:, cut:n]), jnp.asarray(arange(B, cut, n)),
                  jnp.ones((B, n - cut), jnp.int32), first.cache)
    logits = np.concatenate([np.asarray(first.logits), np.asarray(second.logits)], 1)
    routes = np.concatenate([np.asarray(first.routes), np.asarray(second.routes)], 1)
    np.testing.assert_allclose(logits, np.asarray(one.logits), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(routes, np.asarray(one.routes))
    np.testing.assert_array_equal(np.asarray(second.cache.lengths), np.asarray(one.cache.lengths))
    for a, b in zip(second.cache.layers, one.cache.layers):
        np.testing.assert_allclose(np.asarray(a.k), np.asarray(b.k), rtol=0, atol=ATOL)
        np.testing.assert_allclose(np.asarray(a.v), np.asarray(b.v), rtol=0, atol=ATOL)


def test_jit_decode_step_compiles_once(setup):
    cfg, model, tokens, _ = setup
    graphdef, state = nnx.split(model)
    traces = []

    @jax.jit
    def decode(state, token, position, cache):
        traces.append(1)  # python side effect: runs only while tracing
        out = nnx.merge(graphdef, state)(token, position, jnp.ones_like(token), cache=cache)
        return out.logits, out.routes, out.cache

    prompt = PROMPT
    out = step(model, jnp.asarray(tokens[:, :prompt]), jnp.asarray(arange(B, 0, prompt)),
               jnp.ones((B, prompt), jnp.int32), KVCache.create(cfg, B, MAX_LEN))
    logits, routes, cache = [out.logits], [out.routes], out.cache
    for t in range(prompt, S):
        lg, rt, cache = decode(state, jnp.asarray(tokens[:, t:t + 1]),
                               jnp.full((B, 1), t, jnp.int32), cache)
        logits.append(lg)
        routes.append(rt)
    assert len(traces) == 1, f"decode step traced {len(traces)} times"
    assert decode._cache_size() == 1
    ref = full_forward(model, tokens)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(logits, 1)), np.asarray(ref.logits),
                               rtol=0, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(jnp.concatenate(routes, 1)), np.asarray(ref.routes))


@pytest.mark.slow
def test_bfloat16_compute(setup):
    """bf16 params and compute (prefill + cached decode): runs, float32 logits close-ish to the
    float32 model's, the cache holds bf16."""
    cfg, model32, tokens, path = setup
    cfg16 = cfg.replace(compute_dtype="bfloat16", param_dtype="bfloat16")
    model16 = load_hf(nnx.eval_shape(lambda: CausalLM(cfg16, nnx.Rngs(0))), path)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(model16, nnx.Param)))
    ref32 = full_forward(model32, tokens)
    logits, routes, cache = generate_like(model16, cfg16, tokens, prompt_len=PROMPT)
    assert cache.layers[0].k.dtype == jnp.bfloat16
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    diff = np.abs(logits - np.asarray(ref32.logits))
    scale = np.abs(np.asarray(ref32.logits)).max()
    assert diff.max() < 0.1 * scale, (diff.max(), scale)
    # mostly the same experts (bf16 rounding may flip near-ties)
    same = (np.sort(routes, -1) == np.sort(np.asarray(ref32.routes), -1)).all(-1)
    assert same.mean() > 0.8, same.mean()
