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
    """Qwen3's RMSNorm (weight starts at 1; normalise in float32, cast, then scale), or with
    `zero_centered` Qwen3.5's (weight starts at 0 and scales by 1 + weight in float32, then
    casts): the two round differently in bfloat16, so each follows its HF original."""

    def __init__(self, dim: int, eps: float, dtype, zero_centered: bool = False):
        self.weight = param(None, (dim,), ("norm",), dtype,
                            init="zeros" if zero_centered else "ones")
        self.eps, self.zero_centered = eps, zero_centered

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.zero_centered:
            return (normed * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float,
         rotary_dim: int | None = None) -> jax.Array:
    """Rotary embedding in HF's rotate-half layout on the first `rotary_dim` dims of each head
    (default all; Qwen3.5 rotates a quarter), the rest passing through.
    x: [B, S, heads, head_dim]; positions [B, S]."""
    dim = x.shape[-1] if rotary_dim is None else rotary_dim
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, S, dim/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x.astype(jnp.float32)
    rot, rest = x32[..., :dim], x32[..., dim:]
    half = dim // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return jnp.concatenate([rot * cos + rotated * sin, rest], axis=-1).astype(x.dtype)


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
