"""The Gated Delta Rule: the chunked (training) form against the token scan, against transformers'
torch reference, and on packed / padded rows, gradients and token-by-token decode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t1jax.model.gated_delta import chunked_gated_delta, recurrent_gated_delta

B, S, H, DK, DV, CHUNK = 2, 37, 3, 8, 6, 16  # S is not a multiple of the chunk
TOL = 1e-5

chunked_any = jax.jit(chunked_gated_delta, static_argnames="chunk_size")
chunked = functools.partial(chunked_any, chunk_size=CHUNK)
recurrent = jax.jit(recurrent_gated_delta)
FORMS = {"chunked": chunked, "recurrent": recurrent}


def l2norm(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def inputs(seed=0, b=B, s=S, scaled=True):
    """Normalised q/k (q scaled by dk**-0.5 as callers do), log decays <= 0, beta in (0, 1)."""
    ks = jax.random.split(jax.random.key(seed), 5)
    q = l2norm(jax.random.normal(ks[0], (b, s, H, DK)))
    if scaled:
        q = q * DK ** -0.5
    k = l2norm(jax.random.normal(ks[1], (b, s, H, DK)))
    v = jax.random.normal(ks[2], (b, s, H, DV))
    g = -jax.nn.softplus(jax.random.normal(ks[3], (b, s, H)))
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, s, H)))
    return q, k, v, g, beta


def initial_state(seed=1, b=B):
    return jax.random.normal(jax.random.key(seed), (b, H, DK, DV))


def close(a, b, tol=TOL):
    a, b = np.asarray(a), np.asarray(b)
    assert b.ndim == 0 or a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=0, atol=tol)


def take(x, idx):
    """The tokens idx of every row (the tests give all rows the same segment ids)."""
    return x[:, np.asarray(idx)]


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("chunk", [4, CHUNK, 64])  # many chunks; the default; one padded chunk
@pytest.mark.slow
def test_chunked_matches_recurrent(with_state, chunk):
    args = inputs()
    state = initial_state() if with_state else None
    out_c, fin_c = chunked_any(*args, initial_state=state, chunk_size=chunk)
    out_r, fin_r = recurrent(*args, initial_state=state)
    assert out_c.shape == (B, S, H, DV) and fin_c.shape == (B, H, DK, DV)
    assert fin_c.dtype == jnp.float32
    close(out_c, out_r)
    close(fin_c, fin_r)
    assert np.abs(np.asarray(out_r)).max() > 0.1  # a real signal, not two zero arrays


@pytest.mark.slow
def test_matches_transformers():
    import torch
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
        torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule)

    q, k, v, g, beta = inputs(scaled=False)  # the torch functions scale q themselves
    state = initial_state()
    t = [torch.from_numpy(np.array(x)) for x in (q, k, v, g, beta, state)]
    ours = chunked(q * DK ** -0.5, k, v, g, beta, initial_state=state)
    for fn, extra in ((torch_chunk_gated_delta_rule, {"chunk_size": CHUNK}),
                      (torch_recurrent_gated_delta_rule, {})):
        out, fin = fn(*t[:5], initial_state=t[5], output_final_state=True,
                      use_qk_l2norm_in_kernel=False, **extra)
        # torch's float32 summation order differs from XLA's: 1.5e-5 seen once in CI
        close(ours[0], out.numpy(), tol=3e-5)
        close(ours[1], fin.numpy(), tol=3e-5)


@pytest.mark.slow
def test_dtype_follows_input():
    args = [x.astype(jnp.bfloat16) for x in inputs()]
    for form in FORMS.values():
        out, fin = form(*args)
        assert out.dtype == jnp.bfloat16 and fin.dtype == jnp.float32


@pytest.mark.parametrize("name", FORMS)
@pytest.mark.parametrize("first", [10, 16, 21])  # boundary inside chunk 0, on a chunk edge, in chunk 1
@pytest.mark.slow
def test_packed_equals_separate(name, first):
    """Two sequences in one row (then right padding) give what each gives alone; the row's initial
    state belongs to the first sequence only."""
    form = FORMS[name]
    second = 12
    segs = np.array([[1] * first + [2] * second + [0] * (S - first - second)] * B, np.int32)
    args = inputs()
    state = initial_state()
    out, fin = form(*args, segment_ids=segs, initial_state=state)

    idx1, idx2 = np.arange(first), np.arange(first, first + second)
    out1, _ = form(*(take(x, idx1) for x in args), initial_state=state)
    out2, fin2 = form(*(take(x, idx2) for x in args))
    close(out[:, idx1], out1)
    close(out[:, idx2], out2)
    close(out[:, first + second:], 0.0)
    close(fin, fin2)

    # The reset matters: without it the second sequence reads the first one's state.
    leaky, _ = form(*args, initial_state=state)
    assert np.abs(np.asarray(leaky[:, idx2] - out2)).max() > 1e-3


@pytest.mark.parametrize("name", FORMS)
@pytest.mark.slow
def test_padding(name):
    """Right padding, padding between segments and holes inside a segment change nothing on the
    valid tokens; padding outputs are 0 and the final state is the last valid token's."""
    form = FORMS[name]
    args = inputs()
    state = initial_state()

    # Right padding: the unpadded prefix of the same row. NaNs in the padding must not leak.
    n = 30
    segs = np.array([[1] * n + [0] * (S - n)] * B, np.int32)
    garbage = [x.at[:, n:].set(jnp.nan) for x in args]
    out, fin = form(*garbage, segment_ids=segs, initial_state=state)
    ref, ref_fin = form(*(x[:, :n] for x in args), initial_state=state)
    close(out[:, :n], ref)
    close(out[:, n:], 0.0)
    close(fin, ref_fin)

    # Leading padding, holes inside segment 1, padding between segments 1 and 2 (where the
    # boundary falls on the chunk edge at 16) and after segment 2.
    row = [0, 0] + [1] * 5 + [0] + [1] * 6 + [0, 0] + [2] * 9 + [0] * 3 + [2] * 4 + [0] * 5
    assert len(row) == S
    row = np.array(row, np.int32)
    segs = np.stack([row, row])
    out, fin = form(*args, segment_ids=segs, initial_state=state)
    idx1, idx2 = np.flatnonzero(row == 1), np.flatnonzero(row == 2)
    out1, _ = form(*(take(x, idx1) for x in args), initial_state=state)
    out2, fin2 = form(*(take(x, idx2) for x in args))
    close(out[:, idx1], out1)
    close(out[:, idx2], out2)
    close(out[:, row == 0], 0.0)
    close(fin, fin2)


@pytest.mark.slow
def test_gradients_agree():
    """d loss / d(q, k, v, g, beta) of both forms, on a packed and padded row with an initial state.

    Tolerance 1e-5 of each gradient's largest entry, not per element: the two backward passes sum
    float32 terms in different orders (a triangular solve and chunk matmuls vs a token scan), so
    entries near zero differ by ulps of the large ones. Measured: <= 2e-7 of the largest entry."""
    args = inputs()
    state = initial_state()
    row = [1] * 13 + [2] * 11 + [0] * 2 + [3] * 8 + [0] * 3
    segs = np.array([row, [1] * S], np.int32)
    w = jax.random.normal(jax.random.key(7), (B, S, H, DV))

    def loss(fn):
        def f(q, k, v, g, beta, s0):
            out, fin = fn(q, k, v, g, beta, segment_ids=segs, initial_state=s0)
            return jnp.sum(out * w) + jnp.sum(fin ** 2)
        return jax.jit(jax.grad(f, argnums=tuple(range(6))))

    grads_c = loss(functools.partial(chunked_gated_delta, chunk_size=CHUNK))(*args, state)
    grads_r = loss(recurrent_gated_delta)(*args, state)
    for name, gc, gr in zip(("q", "k", "v", "g", "beta", "initial_state"), grads_c, grads_r):
        gc, gr = np.asarray(gc), np.asarray(gr)
        assert np.isfinite(gc).all(), name
        scale = np.abs(gr).max()
        assert scale > 1e-3, name  # a gradient that is really there
        np.testing.assert_allclose(gc, gr, rtol=0, atol=1e-5 * scale, err_msg=name)


def test_decode_token_by_token():
    """Decoding one token at a time, each call starting from the last final state, equals one
    chunked call over the whole sequence."""
    args = inputs()
    state = initial_state()
    out, fin = chunked(*args, initial_state=state)
    step_outs = []
    for t in range(S):
        o, state = recurrent(*(x[:, t:t + 1] for x in args), initial_state=state)
        step_outs.append(o)
    close(jnp.concatenate(step_outs, axis=1), out)
    close(state, fin)


@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.slow
def test_chunk_groups_change_nothing(group):
    """Chunks run in checkpointed groups (10 chunks of 4 here: groups of 3 and 4 pad the row with
    whole padding chunks); outputs, final state and gradients equal the token scan's on a packed,
    padded row with an initial state."""
    args = inputs()
    state = initial_state()
    row = [1] * 13 + [2] * 11 + [0] * 2 + [3] * 8 + [0] * 3
    segs = np.array([row, [1] * S], np.int32)
    w = jax.random.normal(jax.random.key(7), (B, S, H, DV))
    grouped = functools.partial(chunked_gated_delta, chunk_size=4, group=group)

    def loss(fn):
        def f(q, k, v, g, beta, s0):
            out, fin = fn(q, k, v, g, beta, segment_ids=segs, initial_state=s0)
            return jnp.sum(out * w) + jnp.sum(fin ** 2), (out, fin)
        return jax.jit(jax.grad(f, argnums=tuple(range(6)), has_aux=True))

    grads_c, (out_c, fin_c) = loss(grouped)(*args, state)
    grads_r, (out_r, fin_r) = loss(recurrent_gated_delta)(*args, state)
    close(out_c, out_r)
    close(fin_c, fin_r)
    for gc, gr in zip(grads_c, grads_r):
        scale = np.abs(np.asarray(gr)).max()
        np.testing.assert_allclose(np.asarray(gc), np.asarray(gr), rtol=0, atol=1e-5 * scale)


def test_default_group_is_about_the_square_root():
    from t1jax.model.gated_delta import default_group
    assert [default_group(n) for n in (1, 3, 4, 15, 16, 1024, 1500)] == [1, 1, 2, 2, 4, 32, 32]


@pytest.mark.parametrize("name", FORMS)
def test_fewer_key_heads_serve_value_heads_in_turn(name):
    """q/k with H/2 heads equal the same q/k repeated per head (transformers' repeat_interleave),
    so callers need not materialise the repeat."""
    q, k, v, g, beta = inputs()
    q, k = q[:, :, :1], k[:, :, :1]  # 1 key head for H = 3 value heads
    out, fin = FORMS[name](q, k, v, g, beta)
    ref, ref_fin = FORMS[name](jnp.repeat(q, H, axis=2), jnp.repeat(k, H, axis=2), v, g, beta)
    close(out, ref)
    close(fin, ref_fin)
    assert np.abs(np.asarray(ref)).max() > 0.1
