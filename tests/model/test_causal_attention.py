"""attend_causal (query blocks scoring only the keys up to their end) against attend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t1jax.model import transformer
from t1jax.model.config import ModelConfig
from t1jax.model.transformer import (MIN_QUERY_BLOCK, CausalLM, attend, attend_causal,
                                     query_block_edges)
from tests.model.test_flash_attention import inputs, packed


def mask_of(pos, seg):
    return ((seg[:, :, None] == seg[:, None, :]) & (pos[:, None, :] <= pos[:, :, None])
            & (seg[:, :, None] > 0))


@pytest.mark.parametrize("blocks", [2, 3, 6])
def test_same_outputs_and_gradients_as_one_score_matrix(blocks):
    q, k, v = inputs(200, h=8, kv=2)
    pos, seg = packed(2, 200, seed=4)
    mask = mask_of(pos, seg)
    valid = np.asarray(seg) > 0  # padding queries see no key: their output is never read
    w = jnp.asarray(np.random.default_rng(5).normal(size=q.shape), jnp.float32) \
        * valid[:, :, None, None]

    def run(fn):
        out = jax.jit(lambda q, k, v: fn(q, k, v, mask, 2))(q, k, v)
        grads = jax.jit(jax.grad(lambda q, k, v: (fn(q, k, v, mask, 2) * w).sum(),
                                 argnums=(0, 1, 2)))(q, k, v)
        return out, grads

    out, grads = run(lambda *a: attend_causal(*a, blocks))
    want, want_grads = run(attend)
    np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(want)[valid], atol=1e-6,
                               rtol=0)
    for got, ref in zip(grads, want_grads):
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


def test_block_edges():
    assert query_block_edges(384, 6) == [0, 64, 128, 192, 256, 320, 384]
    assert query_block_edges(100, 6) == [0, 33, 67, 100]  # no block under MIN_QUERY_BLOCK
    assert query_block_edges(MIN_QUERY_BLOCK * 2 - 1, 6) == [0, MIN_QUERY_BLOCK * 2 - 1]
    assert query_block_edges(384, 1) == [0, 384]


def flops(fn, *args) -> float:
    return jax.jit(fn).lower(*args).compile().cost_analysis()["flops"]


def test_skips_the_scores_above_the_diagonal():
    q, k, v = inputs(384, h=8, kv=2, b=1)
    pos, seg = packed(1, 384)
    mask = mask_of(pos, seg)
    whole = flops(lambda q, k, v: attend(q, k, v, mask, 2), q, k, v)
    blocked = flops(lambda q, k, v: attend_causal(q, k, v, mask, 2, 6), q, k, v)
    assert blocked < 0.65 * whole  # 6 blocks score 7/12 of the square


@pytest.mark.slow
def test_model_logits_do_not_depend_on_the_blocks():
    """The training forward (no cache) of a packed row: same logits on every real token."""
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_experts=4, num_experts_per_tok=2, attention="naive")
    pos, seg = packed(2, 160, seed=7)
    tokens = jnp.asarray(np.random.default_rng(8).integers(1, 64, size=(2, 160)), jnp.int32)
    logits = {}
    for blocks in (1, 5):
        model = CausalLM(ModelConfig(**base, causal_query_blocks=blocks), nnx.Rngs(0))
        forward = nnx.jit(lambda model, *inputs: model(*inputs).logits)
        logits[blocks] = np.asarray(forward(model, tokens, pos, seg))
    valid = np.asarray(seg) > 0
    np.testing.assert_allclose(logits[5][valid], logits[1][valid], atol=1e-5, rtol=0)
    assert transformer.use_flash("naive", 160, 160) is False
