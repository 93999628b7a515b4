"""The decoding cache: per attention layer a [batch, max_len, kv_heads, head_dim] key/value pair,
per linear-attention layer (Qwen3.5's Gated DeltaNet) a fixed-size `LinearState`, and the number
of tokens each row holds. A token at absolute position p is stored in slot p, so rows of one
batch can be at different lengths (continuous batching) and attention needs no offsets.

A linear layer's state summarises all of a row's tokens and cannot be cut back: a row whose
length is set to 0 starts from a zero state, and any other length must be the length the state
was built to (the engine reuses a prefix only when a prompt extends the whole row).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerCache:
    k: jax.Array  # [B, max_len, kv_heads, head_dim]
    v: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearState:
    conv: jax.Array  # [B, kernel - 1, channels]: the last inputs of the causal convolution
    recurrent: jax.Array  # float32 [B, value_heads, key_head_dim, value_head_dim]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    layers: tuple  # LayerCache (attention) or LinearState (linear attention), one per layer
    lengths: jax.Array  # int32 [B]: tokens 0..length-1 of this row are in the cache

    @classmethod
    def create(cls, cfg, batch: int, max_len: int, dtype=None) -> "KVCache":
        dtype = jnp.dtype(dtype or cfg.compute_dtype)
        shape = (batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        channels = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                    + cfg.linear_num_value_heads * cfg.linear_value_head_dim)
        state = (batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                 cfg.linear_value_head_dim)

        def layer(i):
            if cfg.is_linear_layer(i):
                return LinearState(jnp.zeros((batch, cfg.linear_conv_kernel_dim - 1, channels),
                                             dtype), jnp.zeros(state, jnp.float32))
            return LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
        return cls(tuple(layer(i) for i in range(cfg.num_hidden_layers)),
                   jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return next(c.k.shape[1] for c in self.layers if isinstance(c, LayerCache))

    def replace_layers(self, layers, positions, segment_ids) -> "KVCache":
        written = jnp.max(jnp.where(segment_ids > 0, positions + 1, 0), axis=1)
        return KVCache(tuple(layers), jnp.maximum(self.lengths, written).astype(jnp.int32))


def write_and_read(layer: LayerCache, k, v, positions, segment_ids, lengths):
    """Store new keys/values at their positions (padding and out-of-range writes are dropped);
    return the new layer, all keys and values, key positions [B, max_len] and their validity."""
    batch, max_len = layer.k.shape[:2]
    slots = jnp.where(segment_ids > 0, positions, max_len)  # padding -> out of range -> dropped
    rows = jnp.arange(batch)[:, None]
    new_k = layer.k.at[rows, slots].set(k.astype(layer.k.dtype), mode="drop")
    new_v = layer.v.at[rows, slots].set(v.astype(layer.v.dtype), mode="drop")
    key_positions = jnp.broadcast_to(jnp.arange(max_len, dtype=jnp.int32), (batch, max_len))
    filled = jnp.max(jnp.where(segment_ids > 0, positions + 1, 0), axis=1)
    valid = key_positions < jnp.maximum(lengths, filled)[:, None]
    return LayerCache(new_k, new_v), new_k, new_v, key_positions, valid
