"""KV cache for prefill and decode: one [batch, max_len, kv_heads, head_dim] pair per layer and
the number of filled slots per row. A token at absolute position p is stored in slot p, so rows
of one batch can be at different lengths (continuous batching) and attention needs no offsets.
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
class KVCache:
    layers: tuple
    lengths: jax.Array  # int32 [B]: slots 0..length-1 hold keys of this row

    @classmethod
    def create(cls, cfg, batch: int, max_len: int, dtype=None) -> "KVCache":
        dtype = jnp.dtype(dtype or cfg.compute_dtype)
        shape = (batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        layers = tuple(LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
                       for _ in range(cfg.num_hidden_layers))
        return cls(layers, jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.layers[0].k.shape[1]

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
