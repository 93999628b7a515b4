"""The MoE feed-forward with routing as a value: `route(x)` picks experts, `__call__(x, indices)`
runs them. Passing recorded indices (R3, rollout routing replay) fixes the expert *selection*,
while the gate *weights* are recomputed from the live router, so the router keeps its gradient.
A token whose recorded row is all -1 (the rollout never ran the model on it, e.g. a sample's
last token) routes freely. The router's own top-k is returned even under replay, so the
trainer can measure how often it disagrees with the rollout.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from t1jax.model.expert_sharding import expert_ffn_sharded
from t1jax.model.layers import param


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Routing:
    """Experts chosen per token (int32 [..., k], -1 = none) and their gate weights [..., k]."""
    indices: jax.Array
    weights: jax.Array


def gate_weights(probs: jax.Array, indices: jax.Array, normalize: bool) -> jax.Array:
    """Gate weights of the chosen experts from the router's full softmax; -1 entries get 0."""
    picked = jnp.take_along_axis(probs, jnp.maximum(indices, 0), axis=-1)
    picked = jnp.where(indices >= 0, picked, 0.0)
    if normalize:
        picked = picked / jnp.maximum(picked.sum(-1, keepdims=True), 1e-20)
    return picked


def load_balancing_loss(probs_te: jax.Array, indices_tk: jax.Array, valid_t: jax.Array) -> jax.Array:
    """Switch-style auxiliary loss, as transformers computes it for Qwen3-MoE (per layer):
    E * sum_e (fraction of assignments to e per top-k slot) * (mean router probability of e)."""
    num_experts = probs_te.shape[-1]
    weight = valid_t.astype(jnp.float32)
    count = jnp.maximum(weight.sum(), 1.0)
    one_hot = jax.nn.one_hot(indices_tk, num_experts, dtype=jnp.float32)  # -1 -> zeros
    tokens_per_expert = jnp.einsum("tke,t->ke", one_hot, weight) / count
    prob_per_expert = jnp.einsum("te,t->e", probs_te, weight) / count
    return num_experts * jnp.sum(tokens_per_expert * prob_per_expert[None, :])


class MoE(nnx.Module):
    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, normalize: bool,
                 dtype, rngs: nnx.Rngs, dispatch: str = "auto", token_chunk: int = 8192,
                 sharding: str = "gather_weights"):
        self.router = param(rngs, (dim, num_experts), ("embed", None), dtype)
        self.gate = param(rngs, (num_experts, dim, hidden), ("expert", "embed", "expert_mlp"), dtype)
        self.up = param(rngs, (num_experts, dim, hidden), ("expert", "embed", "expert_mlp"), dtype)
        self.down = param(rngs, (num_experts, hidden, dim), ("expert", "expert_mlp", "embed"), dtype)
        self.top_k, self.normalize, self.dispatch = top_k, normalize, dispatch
        self.token_chunk, self.sharding = token_chunk, sharding

    def router_probs(self, x_td: jax.Array) -> jax.Array:
        logits = x_td @ self.router[...].astype(x_td.dtype)
        return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

    def route(self, x_td: jax.Array) -> Routing:
        """Free routing: top-k of the router's softmax (ties go to the lower expert id)."""
        probs = self.router_probs(x_td)
        _, indices = jax.lax.top_k(probs, self.top_k)
        indices = indices.astype(jnp.int32)
        return Routing(indices, gate_weights(probs, indices, self.normalize))

    def __call__(self, x_td: jax.Array, indices_tk: jax.Array | None = None,
                 valid_t: jax.Array | None = None
                 ) -> tuple[jax.Array, Routing, jax.Array, jax.Array]:
        """Returns (output, the routing used, load-balancing loss, the router's own top-k).
        Tokens with valid_t False (padding) are routed nowhere and reported as -1."""
        probs = self.router_probs(x_td)
        _, free_tk = jax.lax.top_k(probs, self.top_k)
        free_tk = free_tk.astype(jnp.int32)
        if indices_tk is None:
            indices_tk = free_tk
        else:
            indices_tk = indices_tk.astype(jnp.int32)
            recorded = jnp.any(indices_tk >= 0, axis=-1, keepdims=True)
            indices_tk = jnp.where(recorded, indices_tk, free_tk)
        if valid_t is not None:
            indices_tk = jnp.where(valid_t[:, None], indices_tk, -1)
            free_tk = jnp.where(valid_t[:, None], free_tk, -1)
        else:
            valid_t = jnp.ones(x_td.shape[:1], bool)
        weights = gate_weights(probs, indices_tk, self.normalize).astype(x_td.dtype)
        dt = x_td.dtype
        y = expert_ffn_sharded(x_td, indices_tk, weights, self.gate[...].astype(dt),
                               self.up[...].astype(dt), self.down[...].astype(dt),
                               strategy=self.dispatch, chunk=self.token_chunk,
                               mode=self.sharding)
        aux = load_balancing_loss(probs, indices_tk, valid_t)
        return y, Routing(indices_tk, weights), aux, free_tk
