"""Every MoE dispatch strategy computes the same dropless top-k SwiGLU mixture, and the same
gradients (the router learns through weights_tk), checked against a float64 loop and a
gather-based jnp reference."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t1jax.model import dispatch
from t1jax.model.dispatch import STRATEGIES, expert_ffn, expert_ffn_loop_reference

ATOL = 1e-5


def make_inputs(t=37, d=16, f=24, e=8, k=2, seed=0, dtype=np.float32):
    """Random inputs; each token's k experts are distinct, as top-k guarantees."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(t, d)).astype(dtype)
    idx = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    w = rng.random((t, k)).astype(dtype)
    wg = (rng.normal(size=(e, d, f)) / np.sqrt(d)).astype(dtype)
    wu = (rng.normal(size=(e, d, f)) / np.sqrt(d)).astype(dtype)
    wd = (rng.normal(size=(e, f, d)) / np.sqrt(f)).astype(dtype)
    return x, idx, w, wg, wu, wd


def gather_reference(x, idx, w, wg, wu, wd):
    """Jit-able, differentiable reference: gather each assignment's expert weights."""
    valid = idx >= 0
    e = jnp.where(valid, idx, 0)
    gate = jnp.einsum("td,tkdf->tkf", x, wg[e])
    up = jnp.einsum("td,tkdf->tkf", x, wu[e])
    out = jnp.einsum("tkf,tkfd->tkd", jax.nn.silu(gate) * up, wd[e])
    return jnp.einsum("tk,tkd->td", jnp.where(valid, w, 0.0), out)


TRACES: dict[str, int] = {}


@functools.cache
def jitted(strategy):
    """One jitted function per strategy, so tests sharing shapes share one compile."""
    def fn(*args):
        TRACES[strategy] = TRACES.get(strategy, 0) + 1
        return expert_ffn(*args, strategy=strategy)
    return jax.jit(fn)


def run(strategy, x, idx, w, wg, wu, wd):
    return np.asarray(jitted(strategy)(x, idx, w, wg, wu, wd))


def check_against_reference(strategy, inputs):
    ref = expert_ffn_loop_reference(*inputs)
    np.testing.assert_allclose(run(strategy, *inputs), ref, atol=ATOL, rtol=1e-5)
    return ref


def test_gather_reference_matches_loop():
    inputs = make_inputs()
    np.testing.assert_allclose(np.asarray(gather_reference(*inputs)), expert_ffn_loop_reference(*inputs),
                               atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("e,k", [(8, 2), (4, 4)])
def test_matches_loop_reference(strategy, e, k):
    check_against_reference(strategy, make_inputs(e=e, k=k, seed=e + k))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_invalid_indices_contribute_nothing(strategy):
    x, idx, w, wg, wu, wd = make_inputs(seed=1)
    idx[::3, 1] = -1
    idx[5] = -1  # a padding token: no expert at all
    ref = check_against_reference(strategy, (x, idx, w, wg, wu, wd))
    assert np.all(ref[5] == 0)
    assert np.all(run(strategy, x, idx, w, wg, wu, wd)[5] == 0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_skew_every_token_to_one_expert(strategy):
    x, idx, w, wg, wu, wd = make_inputs(seed=2)
    idx[:, 0] = 3
    idx[:, 1] = np.where(idx[:, 1] == 3, 6, idx[:, 1])  # still distinct per token
    check_against_reference(strategy, (x, idx, w, wg, wu, wd))
    idx[:, 1] = -1  # only expert 3 gets any work
    check_against_reference(strategy, (x, idx, w, wg, wu, wd))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_repeated_expert_in_a_row_is_not_dropped(strategy):
    # Not something top-k produces, but nothing may be silently dropped if a caller does it.
    x, idx, w, wg, wu, wd = make_inputs(e=4, k=4, seed=3)
    idx[:] = 2
    check_against_reference(strategy, (x, idx, w, wg, wu, wd))


@pytest.mark.parametrize("tile_rows", [3, 64])
def test_blocked_any_tile_size(tile_rows):
    x, idx, w, wg, wu, wd = make_inputs(seed=4)
    idx[:20, 0] = 1
    idx[::4, 1] = -1
    ref = expert_ffn_loop_reference(x, idx, w, wg, wu, wd)
    fn = jax.jit(functools.partial(dispatch.expert_ffn_blocked, tile_rows=tile_rows))
    np.testing.assert_allclose(np.asarray(fn(x, idx, w, wg, wu, wd)), ref, atol=ATOL, rtol=1e-5)


@functools.cache
def grad_fn(fn):
    """Jitted gradients w.r.t. x, weights_tk and the three expert tensors of <fn(...), cot>."""
    loss = lambda x, idx, w, wg, wu, wd, cot: jnp.sum(fn(x, idx, w, wg, wu, wd) * cot)
    return jax.jit(jax.grad(loss, argnums=(0, 2, 3, 4, 5)))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradients_match(strategy):
    x, idx, w, wg, wu, wd = make_inputs(seed=5)
    idx[::4, 0] = -1
    cot = np.random.default_rng(6).normal(size=x.shape).astype(np.float32)
    args = (x, idx, w, wg, wu, wd, cot)
    got = grad_fn(jitted(strategy))(*args)
    dense = grad_fn(jitted("dense"))(*args)
    ref = grad_fn(gather_reference)(*args)
    for name, g, gd, gr in zip(("x", "weights", "w_gate", "w_up", "w_down"), got, dense, ref):
        assert g.shape == gr.shape, name
        np.testing.assert_allclose(g, gd, atol=ATOL, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(g, gr, atol=ATOL, rtol=1e-5, err_msg=name)
    # The router's gradient is real: nonzero for valid assignments, zero for -1 ones.
    assert np.all(np.asarray(got[1])[::4, 0] == 0)
    assert np.abs(np.asarray(got[1])[1:4]).min() > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bfloat16_close_to_float32(strategy):
    inputs = make_inputs(seed=7)
    x, idx, w, wg, wu, wd = inputs
    bf = [jnp.asarray(a, jnp.bfloat16) for a in (x, w, wg, wu, wd)]
    y = jitted(strategy)(bf[0], idx, *bf[1:])
    assert y.dtype == jnp.bfloat16
    ref = expert_ffn_loop_reference(*inputs)
    np.testing.assert_allclose(np.asarray(y, np.float32), ref, atol=0.05 * np.abs(ref).max(), rtol=0.05)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_jit_static_shapes_no_retrace_on_new_routing(strategy):
    for seed in (8, 9):  # same shapes, different routing
        inputs = make_inputs(seed=seed)
        check_against_reference(strategy, inputs)
        if seed == 8:
            traced = TRACES[strategy]
    assert TRACES[strategy] == traced


def test_auto_resolves_to_a_real_strategy():
    assert dispatch.resolve_strategy("auto") in STRATEGIES
    assert set(dispatch.AUTO) == {"cpu", "gpu", "tpu"} and set(dispatch.AUTO.values()) <= set(STRATEGIES)
    # "auto" traces to exactly the resolved strategy's program (tracing only: no compile).
    inputs = make_inputs(seed=10)
    trace = lambda name: str(jax.make_jaxpr(functools.partial(expert_ffn, strategy=name))(*inputs))
    assert trace("auto") == trace(dispatch.resolve_strategy("auto"))
    with pytest.raises(ValueError, match="unknown"):
        dispatch.resolve_strategy("nope")


# -- bounded passes and the mesh -----------------------------------------------------------------


@pytest.mark.slow
def test_chunked_expert_ffn_equals_one_pass_values_and_grads():
    """chunked_expert_ffn (at most `chunk` tokens per pass, the last chunk padded with expert
    -1) computes the one-pass function, and its gradients, for every input it is given."""
    from t1jax.model.expert_sharding import chunked_expert_ffn
    rng = np.random.RandomState(7)
    t, d, f, e, k = 37, 16, 8, 6, 2
    x = jnp.asarray(rng.randn(t, d), jnp.float32)
    idx = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(t)]), jnp.int32)
    idx = idx.at[5].set(-1)  # a padding token
    w = jnp.asarray(rng.rand(t, k), jnp.float32)
    wg, wu = (jnp.asarray(rng.randn(e, d, f) * 0.3, jnp.float32) for _ in range(2))
    wd = jnp.asarray(rng.randn(e, f, d) * 0.3, jnp.float32)

    def loss(chunk, x, w, wg, wu, wd):
        y = chunked_expert_ffn(x, idx, w, wg, wu, wd, strategy="blocked", chunk=chunk)
        return jnp.sum(y * jnp.cos(jnp.arange(d, dtype=jnp.float32)))

    full = jax.value_and_grad(functools.partial(loss, 1000), argnums=(0, 1, 2, 3, 4))
    parts = jax.value_and_grad(functools.partial(loss, 8), argnums=(0, 1, 2, 3, 4))
    (v0, g0), (v1, g1) = full(x, w, wg, wu, wd), parts(x, w, wg, wu, wd)
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    y = chunked_expert_ffn(x, idx, w, wg, wu, wd, strategy="blocked", chunk=8)
    np.testing.assert_allclose(np.asarray(y), expert_ffn_loop_reference(x, idx, w, wg, wu, wd),
                               rtol=1e-4, atol=1e-5)
