"""Small building blocks shared by the model: parameters with logical axis names, RMSNorm, RoPE,
the dense SwiGLU MLP, and the activation sharding hook."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

INIT_STD = 0.02  # HF's initializer_range for Qwen3


def param(rngs: nnx.Rngs | None, shape, names: tuple, dtype, init: str = "normal") -> nnx.Param:
    """A parameter carrying its logical axis names (mapped to mesh axes by t1jax.sharding)."""
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        value = (INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    assert len(names) == len(shape), (names, shape)
    return nnx.Param(value, out_sharding=names, eager_sharding=False)


def constrain(x: jax.Array, names: tuple) -> jax.Array:
    """Pin an activation's layout by logical names when a mesh is in context; no-op otherwise."""
    from t1jax import sharding
    return sharding.constrain(x, names)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype):
        self.weight = param(None, (dim,), ("norm",), dtype, init="ones")
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        # as HF: normalise in float32, cast back, then scale
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding in HF's rotate-half layout. x: [B, S, heads, head_dim]; positions [B, S]."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, S, hd/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x.astype(jnp.float32)
    half = head_dim // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


class MLP(nnx.Module):
    """Dense SwiGLU feed-forward (Qwen3-MoE's dense layers)."""

    def __init__(self, dim: int, hidden: int, dtype, rngs: nnx.Rngs):
        self.gate = param(rngs, (dim, hidden), ("embed", "mlp"), dtype)
        self.up = param(rngs, (dim, hidden), ("embed", "mlp"), dtype)
        self.down = param(rngs, (hidden, dim), ("mlp", "embed"), dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        h = jax.nn.silu(x @ self.gate[...].astype(dt)) * (x @ self.up[...].astype(dt))
        return h @ self.down[...].astype(dt)
