"""Chunked token statistics (t1jax/rl/token_stats.py) against the trainer's unchunked path
(full logits -> trainer.token_logprobs / ppo.entropy / argmax): values, gradients, bf16, and
that the chunked backward really never holds a whole [B, L, V] logits tensor."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t1jax.rl import ppo
from t1jax.rl.token_stats import token_stats as _token_stats
from t1jax.rl.trainer import token_logprobs


# jitted so the many small cases compile once per shape (temperature is traced)
token_stats = jax.jit(_token_stats, static_argnames=("chunk", "entropy", "accuracy"))


@jax.jit
def reference(hidden, head, tokens, temperature):
    logits = jnp.einsum("bsd,dv->bsv", hidden, head.astype(hidden.dtype),
                        preferred_element_type=jnp.float32)
    front = ((0, 0), (1, 0))
    return {"logp": token_logprobs(logits, tokens, temperature),
            "entropy": jnp.pad(ppo.entropy(logits[:, :-1], temperature), front),
            "correct": jnp.pad((jnp.argmax(logits[:, :-1], -1) == tokens[:, 1:])
                               .astype(jnp.float32), front)}


def inputs(B=2, L=37, D=16, V=96, dtype=jnp.float32, seed=0):
    """numpy draws (eager jax.random ops would each compile: seconds on 2 cores)."""
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal((B, L, D), np.float32), dtype)
    head = jnp.asarray(rng.standard_normal((D, V), np.float32) * 3 / np.sqrt(D), dtype)
    tokens = rng.integers(0, V, (B, L)).astype(np.int32)
    # every other target is the previous position's argmax, so "correct" has hits to match
    logits = np.asarray(hidden, np.float32) @ np.asarray(head, np.float32)
    tokens[:, 1::2] = np.argmax(logits, -1)[:, 0:-1:2]
    return hidden, head, jnp.asarray(tokens)


def weights(B, L, seed=1):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((B, L), np.float32)),
            jnp.asarray(rng.standard_normal((B, L), np.float32)))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 8, 36, 64])  # L - 1 = 36 predicting positions
def test_values_match_unchunked(chunk, temperature):
    hidden, head, tokens = inputs()
    got = token_stats(hidden, head, tokens, temperature, chunk=chunk, entropy=True,
                      accuracy=True)
    want = reference(hidden, head, tokens, temperature)
    assert set(got) == {"logp", "entropy", "correct"}
    for name in want:
        assert got[name].shape == tokens.shape and got[name].dtype == jnp.float32
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5, err_msg=name)
    assert float(want["correct"].sum()) > 0  # the accuracy comparison is not vacuous


def test_optional_outputs_and_short_rows():
    hidden, head, tokens = inputs(L=9)
    assert set(token_stats(hidden, head, tokens, chunk=4)) == {"logp"}
    one = token_stats(hidden[:, :1], head, tokens[:, :1], entropy=True, accuracy=True)
    assert all(v.shape == (2, 1) and not v.any() for v in one.values())


@functools.partial(jax.jit, static_argnames="chunk")
def grads(hidden, head, tokens, temperature, chunk=None):
    """d/d(hidden, head) of sum(w * logp) + sum(u * entropy); chunk=None: the reference."""
    w, u = weights(*tokens.shape)

    def loss(hidden, head):
        s = (reference(hidden, head, tokens, temperature) if chunk is None else
             token_stats(hidden, head, tokens, temperature, chunk=chunk, entropy=True))
        return jnp.sum(w * s["logp"]) + jnp.sum(u * s["entropy"])
    return jax.grad(loss, argnums=(0, 1))(hidden, head)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [5, 64])
def test_gradients_match_unchunked(chunk, temperature):
    hidden, head, tokens = inputs()
    got = grads(hidden, head, tokens, temperature, chunk=chunk)
    want = grads(hidden, head, tokens, temperature)
    for g, r, name in zip(got, want, ("hidden", "head")):
        scale = float(jnp.max(jnp.abs(r)))
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    assert not np.any(got[0][:, -1])  # the last position predicts nothing


def test_bfloat16_matches_reference_on_same_inputs():
    hidden, head, tokens = inputs(dtype=jnp.bfloat16)
    got = token_stats(hidden, head, tokens, 0.7, chunk=8, entropy=True, accuracy=True)
    want = reference(hidden, head, tokens, 0.7)
    for name in ("logp", "entropy"):
        assert got[name].dtype == jnp.float32
        np.testing.assert_allclose(got[name], want[name], atol=2e-2, rtol=2e-2, err_msg=name)
    assert float(jnp.mean(got["correct"] == want["correct"])) > 0.95
    got, want = grads(hidden, head, tokens, 0.7, chunk=8), grads(hidden, head, tokens, 0.7)
    for g, r, name in zip(got, want, ("hidden", "head")):
        assert g.dtype == jnp.bfloat16
        g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
        np.testing.assert_allclose(g, r, rtol=5e-2, atol=5e-2 * np.abs(r).max(), err_msg=name)


def temp_bytes(stats_fn, B=1, L=2048, D=64, V=8192):
    hidden = jax.ShapeDtypeStruct((B, L, D), jnp.float32)
    head = jax.ShapeDtypeStruct((D, V), jnp.float32)
    tokens = jax.ShapeDtypeStruct((B, L), jnp.int32)

    def loss(hidden, head, tokens):
        s = stats_fn(hidden, head, tokens)
        return jnp.sum(s["logp"]) + jnp.sum(s["entropy"])

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, head, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_backward_never_holds_full_logits():
    logits_bytes = 1 * 2048 * 8192 * 4  # one float32 [B, L, V] tensor: 64 MiB
    chunked = temp_bytes(lambda h, W, t: token_stats(h, W, t, chunk=256, entropy=True))
    unchunked = temp_bytes(lambda h, W, t: reference(h, W, t, 1.0))
    assert chunked < logits_bytes / 2, chunked
    assert unchunked > logits_bytes / 2, unchunked  # the measurement discriminates
