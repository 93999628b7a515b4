"""Qwen3.5's Gated DeltaNet token mixer (transformers' `Qwen3_5MoeGatedDeltaNet`), in JAX.

Per token: project q, k, v (a short causal depthwise convolution + SiLU over them), a decay
g = -exp(A_log) * softplus(a + dt_bias) and a write strength beta = sigmoid(b); run the gated
delta rule (t1jax.model.gated_delta) on L2-normalised q, k; normalise the output per head and
gate it with SiLU(z); project back. A row's whole past lives in a fixed-size state (the last
kernel-1 conv inputs and a [value_heads, key_dim, value_dim] matrix), so decoding costs the same
at any context length.

Why separate q/k/v weights (HF fuses them in `in_proj_qkv` and one conv): the heads then shard
over the tensor axis like attention heads; the conv is per channel, so splitting it is exact.
hf_io splits and re-fuses at the checkpoint boundary.

Packed rows: a token's convolution and recurrence never see tokens of another segment (the
state resets where the segment id changes), and padding (segment 0) changes nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t1jax.model.cache import LinearState
from t1jax.model.config import ModelConfig
from t1jax.model.gated_delta import chunked_gated_delta, recurrent_gated_delta
from t1jax.model.layers import RMSNorm, constrain, param


def causal_conv(x, weight, segment_ids, prefix=None):
    """Depthwise causal convolution as HF's conv1d (weight [K, C]; w[K-1] multiplies the current
    token), not reaching across segments. x [B, S, C]; `prefix` [B, K-1, C] holds the inputs
    before x (from the cache; they belong to the row's first segment), else zeros."""
    b, s, c = x.shape
    kernel = weight.shape[0]
    if prefix is None:
        prefix = jnp.zeros((b, kernel - 1, c), x.dtype)
    xx = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
    seg = jnp.concatenate([jnp.broadcast_to(segment_ids[:, :1], (b, kernel - 1)), segment_ids],
                          axis=1)
    out = jnp.zeros((b, s, c), jnp.float32)
    for i in range(kernel):  # tap i reads the token kernel-1-i steps back
        same = (seg[:, i:i + s] == segment_ids)[..., None]
        out = out + jnp.where(same, xx[:, i:i + s], 0).astype(jnp.float32) * weight[i]
    return out.astype(x.dtype)


def _last_inputs(prefix, x, valid_count, kernel: int):
    """The conv state after this call: the last kernel-1 inputs up to each row's last valid
    token (valid tokens are a prefix of the row: right padding, idle rows count 0)."""
    xx = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
    take = lambda row, n: jax.lax.dynamic_slice_in_dim(row, n, kernel - 1, axis=0)  # noqa: E731
    return jax.vmap(take)(xx, valid_count)


def l2_normalize(x, eps: float = 1e-6):
    """As HF / FLA: x * rsqrt(sum(x^2) + eps), in float32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


class GatedRMSNorm(RMSNorm):
    """RMSNorm of each head's output (weight starts at 1), then times SiLU(gate), as HF's
    Qwen3_5MoeRMSNormGated."""

    def __call__(self, x, gate):
        out = super().__call__(x)
        return (out.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


class GatedDeltaNet(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
        d = cfg.hidden_size
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv, kernel = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
        self.q = param(rngs, (d, hk, dk), ("embed", "linear_k_heads", "head_dim"), dtype)
        self.k = param(rngs, (d, hk, dk), ("embed", "linear_k_heads", "head_dim"), dtype)
        self.v = param(rngs, (d, hv, dv), ("embed", "linear_v_heads", "head_dim"), dtype)
        self.z = param(rngs, (d, hv, dv), ("embed", "linear_v_heads", "head_dim"), dtype)
        self.b = param(rngs, (d, hv), ("embed", "linear_v_heads"), dtype)
        self.a = param(rngs, (d, hv), ("embed", "linear_v_heads"), dtype)
        self.conv_q = param(rngs, (kernel, hk, dk), ("conv", "linear_k_heads", "head_dim"), dtype)
        self.conv_k = param(rngs, (kernel, hk, dk), ("conv", "linear_k_heads", "head_dim"), dtype)
        self.conv_v = param(rngs, (kernel, hv, dv), ("conv", "linear_v_heads", "head_dim"), dtype)
        self.dt_bias = param(None, (hv,), ("linear_v_heads",), dtype, init="ones")
        # HF draws A uniformly in [0.01, 16] and stores log(A)
        a_init = jax.random.uniform(rngs.params(), (hv,), jnp.float32, 0.01, 16.0)
        self.A_log = nnx.Param(jnp.log(a_init).astype(dtype), out_sharding=("linear_v_heads",),
                               eager_sharding=False)
        self.norm = GatedRMSNorm(dv, cfg.rms_norm_eps, dtype)
        self.out = param(rngs, (hv, dv, d), ("linear_v_heads", "head_dim", "embed"), dtype)
        self.kernel, self.heads = kernel, (hk, hv, dk, dv)

    def __call__(self, x, segment_ids, state: LinearState | None = None, cache_lengths=None):
        """x [B, S, D] -> ([B, S, D], the new LinearState or None without a cache)."""
        hk, hv, dk, dv = self.heads
        b, s, _ = x.shape
        dt = x.dtype
        valid = segment_ids > 0
        x = jnp.where(valid[..., None], x, 0).astype(dt)  # as HF: padding contributes nothing
        proj = lambda w: jnp.einsum("bsd,d...->bs...", x, w[...].astype(dt))  # noqa: E731
        q, k, v, z = proj(self.q), proj(self.k), proj(self.v), proj(self.z)
        mixed = jnp.concatenate([q.reshape(b, s, -1), k.reshape(b, s, -1),
                                 v.reshape(b, s, -1)], axis=-1)
        weight = jnp.concatenate([self.conv_q[...].reshape(self.kernel, -1),
                                  self.conv_k[...].reshape(self.kernel, -1),
                                  self.conv_v[...].reshape(self.kernel, -1)], axis=-1)
        if state is None:
            prefix, initial = None, None
        else:  # a row cut to length 0 starts afresh (see t1jax.model.cache)
            fresh = (cache_lengths == 0)
            prefix = jnp.where(fresh[:, None, None], 0, state.conv).astype(dt)
            initial = jnp.where(fresh[:, None, None, None], 0.0, state.recurrent)
        conv = jax.nn.silu(causal_conv(mixed, weight.astype(dt), segment_ids, prefix)
                           .astype(jnp.float32)).astype(dt)
        q, k, v = jnp.split(conv, [hk * dk, 2 * hk * dk], axis=-1)
        q = l2_normalize(q.reshape(b, s, hk, dk)) * (dk ** -0.5)
        k = l2_normalize(k.reshape(b, s, hk, dk))
        v = v.reshape(b, s, hv, dv)
        beta = jax.nn.sigmoid(proj(self.b).astype(jnp.float32))
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            proj(self.a).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32))
        rule = recurrent_gated_delta if s == 1 else chunked_gated_delta
        # q/k keep their hk heads and v its dtype: the rule repeats and widens them a chunk group at
        # a time, not as [B, S, hv, d] float32 copies of the whole row
        core, final = rule(q, k, v, g, beta, segment_ids=segment_ids, initial_state=initial)
        core = constrain(core.astype(dt), ("batch", "length", "linear_v_heads", "head_dim"))
        out = self.norm(core, z)
        out = jnp.einsum("bshk,hkd->bsd", out, self.out[...].astype(dt))
        new_state = None
        if state is not None:
            count = jnp.sum(valid, axis=1).astype(jnp.int32)
            new_state = LinearState(_last_inputs(prefix, mixed, count, self.kernel)
                                    .astype(state.conv.dtype), final)
        return out, new_state
