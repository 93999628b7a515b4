"""flash_attention against a naive reference: forward, gradients, the KV-cache shape, and the two
properties it exists for: no [S, T] score buffer, and index_causal skipping half the block pairs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t1jax.model.flash_attention import _key_blocks, block_pairs, flash_attention


def reference(q, k, v, qpos, qseg, kpos, kseg):
    """Naive float32 attention with the same mask; rows that see no key are 0."""
    b, s, h, d = q.shape
    kv = k.shape[2]
    qf = q.astype(jnp.float32).reshape(b, s, kv, h // kv, d)
    scores = jnp.einsum("bskgd,btkd->bkgst", qf, k.astype(jnp.float32)) * d ** -0.5
    mask = ((qseg[:, :, None] == kseg[:, None, :]) & (qseg[:, :, None] > 0)
            & (kpos[:, None, :] <= qpos[:, :, None]))
    scores = jnp.where(mask[:, None, None], scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1) * mask.any(-1)[:, None, None, :, None]
    return jnp.einsum("bkgst,btkd->bskgd", probs, v.astype(jnp.float32)).reshape(b, s, h, d)


def inputs(s, h=4, kv=2, d=16, b=2, t=None, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    t = s if t is None else t
    q, k, v = (jnp.asarray(rng.normal(size=shape), dtype)
               for shape in ((b, s, h, d), (b, t, kv, d), (b, t, kv, d)))
    return q, k, v


def single_segment(b, s):
    return jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)), jnp.ones((b, s), jnp.int32)


def packed(b, s, seed=0):
    """Rows of several segments (positions restart at 0 in each) and trailing padding (id 0)."""
    rng = np.random.default_rng(seed)
    pos, seg = np.zeros((b, s), np.int32), np.zeros((b, s), np.int32)
    for row in range(b):
        start, sid = 0, 1
        while start < s - s // 5:  # leave at least s // 5 tokens of padding
            n = min(int(rng.integers(3, s // 2)), s - s // 5 - start)
            pos[row, start:start + n], seg[row, start:start + n] = np.arange(n), sid
            start, sid = start + n, sid + 1
    return jnp.asarray(pos), jnp.asarray(seg)


def check(q, k, v, pos, seg, atol=1e-5, **kw):
    out = jax.jit(lambda *a: flash_attention(*a, **kw))(q, k, v, pos, seg, pos, seg)
    want = jax.jit(reference)(q, k, v, pos, seg, pos, seg)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=atol, rtol=0)
    return out


@pytest.mark.parametrize("index_causal", [False, True])
def test_single_segment_causal(index_causal):
    q, k, v = inputs(64)
    check(q, k, v, *single_segment(2, 64), block_q=16, block_k=32, index_causal=index_causal)


@pytest.mark.parametrize("index_causal", [False, True])
def test_packed_rows_ragged_length(index_causal):
    """S = 75 is no multiple of the blocks; padding rows get exactly 0."""
    q, k, v = inputs(75)
    pos, seg = packed(2, 75)
    out = check(q, k, v, pos, seg, block_q=16, block_k=32, index_causal=index_causal)
    assert np.all(np.asarray(out)[np.asarray(seg) == 0] == 0)


def test_index_causal_is_exact_and_heads_equal():
    """index_causal only skips work: same result. H == KV (no grouping) also works."""
    q, k, v = inputs(80, h=2, kv=2)
    pos, seg = packed(2, 80, seed=1)
    a = check(q, k, v, pos, seg, block_q=16, block_k=16, index_causal=False)
    b = check(q, k, v, pos, seg, block_q=16, block_k=16, index_causal=True)
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_bfloat16():
    q, k, v = inputs(70, dtype=jnp.bfloat16)
    check(q, k, v, *packed(2, 70), atol=3e-2, block_q=16, block_k=32, index_causal=True)


def test_kv_cache_shape():
    """5 new queries at positions 40..44 against a 64-slot cache of which 45 slots are valid."""
    q, k, v = inputs(5, t=64)
    qpos = jnp.broadcast_to(jnp.arange(40, 45, dtype=jnp.int32), (2, 5))
    qseg = jnp.ones((2, 5), jnp.int32)
    kpos = jnp.broadcast_to(jnp.arange(64, dtype=jnp.int32), (2, 64))
    kseg = jnp.broadcast_to((jnp.arange(64) < 45).astype(jnp.int32), (2, 64))
    want = jax.jit(reference)(q, k, v, qpos, qseg, kpos, kseg)
    for blocks in ({}, {"block_k": 16}):
        out = jax.jit(lambda *a, b=blocks: flash_attention(*a, **b))(q, k, v, qpos, qseg, kpos,
                                                                      kseg)
        np.testing.assert_allclose(out, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("index_causal", [False, True])
def test_gradients(index_causal):
    q, k, v = inputs(61)
    pos, seg = packed(2, 61, seed=2)
    w = jnp.asarray(np.random.default_rng(3).normal(size=q.shape), jnp.float32)

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v) * w).sum()

    flash = jax.jit(jax.grad(loss(lambda q, k, v: flash_attention(
        q, k, v, pos, seg, pos, seg, block_q=16, block_k=16, index_causal=index_causal)),
        argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss(lambda q, k, v: reference(q, k, v, pos, seg, pos, seg)),
                            argnums=(0, 1, 2)))(q, k, v)
    for got, ref in zip(flash, want):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)
    padding = np.asarray(seg) == 0
    assert np.all(np.asarray(flash[0])[padding] == 0)  # padding queries get no gradient
    assert np.all(np.asarray(flash[1])[padding] == 0)  # padding keys neither


S_BIG, BLOCK_BIG = 1024, 128


def big_call(index_causal, grad=False, fn=None):
    """The compiled program of a [1, 1024, 4, 16] self-attention (or its gradient)."""
    q, k, v = inputs(S_BIG, b=1)
    pos, seg = single_segment(1, S_BIG)
    fn = fn or (lambda q, k, v: flash_attention(q, k, v, pos, seg, pos, seg, block_q=BLOCK_BIG,
                                                block_k=BLOCK_BIG, index_causal=index_causal))
    if grad:
        fn = jax.grad(lambda q, k, v, f=fn: f(q, k, v).sum(), argnums=(0, 1, 2))
    return jax.jit(fn).lower(q, k, v).compile()


def test_no_score_matrix_in_memory():
    """Neither the forward nor the backward holds an [S, T] score buffer: temp memory stays under
    a quarter of one float32 [B, H, S, T] tensor, which the naive reference exceeds."""
    limit = 1 * 4 * S_BIG * S_BIG * 4 // 4
    for grad in (False, True):
        temp = big_call(True, grad).memory_analysis().temp_size_in_bytes
        assert temp < limit, (grad, temp, limit)
    pos, seg = single_segment(1, S_BIG)
    naive = big_call(True, fn=lambda q, k, v: reference(q, k, v, pos, seg, pos, seg))
    assert naive.memory_analysis().temp_size_in_bytes > limit  # the check has teeth


def test_index_causal_halves_the_work():
    """Each query block's loop over key blocks stops at the last key block starting before the
    query block ends: at 8 x 8 blocks 36 of 64 tiles (the diagonal and below), exactly the
    pairs block_pairs lists, for equal and unequal block sizes. The compiled program (XLA's CPU
    cost_analysis counts a loop body once, so count loops instead): a scan over the 8 query
    blocks, forward and backward, each with a key-block loop of static length 8 without
    index_causal and a data-dependent length with it."""
    for nq, nk, bq, bk in ((8, 8, 128, 128), (4, 8, 256, 128), (8, 4, 128, 256)):
        for causal in (False, True):
            pairs = block_pairs(nq, nk, bq, bk, causal)
            for i in range(nq):
                assert int(_key_blocks(i, bq, bk, nk, causal)) == sum(p[0] == i for p in pairs)
    assert len(block_pairs(8, 8, 128, 128, False)) == 64
    assert len(block_pairs(8, 8, 128, 128, True)) == 36
    trips = {}
    for causal in (False, True):
        compiled = big_call(causal, grad=True)
        trips[causal] = [int(n) for n in re.findall(r'"known_trip_count":\{"n":"(\d+)"',
                                                    compiled.as_text())]
    assert trips[False] == [8, 8, 8, 8] and trips[True] == [8, 8], trips


def test_sharded_batch_and_heads():
    """Under jit on a 2x2 mesh (B over "data", heads over "model") the result is unchanged."""
    q, k, v = inputs(48)
    pos, seg = packed(2, 48, seed=4)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    heads, rows = NamedSharding(mesh, P("data", None, "model")), NamedSharding(mesh, P("data"))
    q, k, v = (jax.device_put(x, heads) for x in (q, k, v))
    pos, seg = (jax.device_put(x, rows) for x in (pos, seg))
    fn = jax.jit(lambda q, k, v, pos, seg: flash_attention(
        q, k, v, pos, seg, pos, seg, block_q=16, block_k=16, index_causal=True))
    np.testing.assert_allclose(fn(q, k, v, pos, seg), reference(q, k, v, pos, seg, pos, seg),
                               atol=1e-5, rtol=0)
