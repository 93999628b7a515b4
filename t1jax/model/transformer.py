"""The Qwen3-MoE / Qwen3.5-MoE decoder with two heads: `CausalLM` (the policy: logits) and
`ValueModel` (the critic: one scalar per token). Qwen3.5 layers differ in four places, all
chosen by the config: linear attention (t1jax.model.linear_attention) on the layers
`layer_types` names, a sigmoid output gate and partial RoPE in full attention, zero-centred
RMSNorms, and a gated shared expert added to the routed experts.

Both heads return the expert routes they used for every token and
layer, as int32 [batch, seq, layers, k] with -1 for dense layers and padding, and take the same
shape back as `routes` to replay them (R3).

Inputs: tokens [B, S]; positions [B, S] (default 0..S-1); segment_ids [B, S] (0 = padding; tokens
attend only within their segment, causally, so several samples can share a row). With a
`KVCache` the call is a prefill or decode step: new keys and values are written at `positions`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from t1jax.model.cache import KVCache, write_and_read
from t1jax.model.config import ModelConfig
from t1jax.model.flash_attention import flash_attention
from t1jax.model.layer_stack import (LAYER_INPUT, layer_slot, remat_policy, scan_layers,
                                     scan_plan, stack_layers, unstacked)
from t1jax.model.layers import MLP, RMSNorm, constrain, param, rope
from t1jax.model.linear_attention import GatedDeltaNet
from t1jax.model.moe import MoE

NEG_INF = -1e30


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelOutput:
    logits: jax.Array | None  # float32 [B, S, vocab] (CausalLM)
    values: jax.Array | None  # float32 [B, S] (ValueModel)
    routes: jax.Array  # int32 [B, S, layers, k]
    aux_loss: jax.Array  # mean load-balancing loss over MoE layers (float32 scalar)
    cache: KVCache | None
    free_routes: jax.Array | None = None  # the router's own top-k (== routes unless replaying)
    hidden: jax.Array | None = None  # the normed final hidden states (CausalLM, logits=False)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
        d, h, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q = param(rngs, (d, h, hd), ("embed", "q_heads", "head_dim"), dtype)
        self.k = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), dtype)
        self.v = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), dtype)
        self.o = param(rngs, (h, hd, d), ("q_heads", "head_dim", "embed"), dtype)
        if cfg.hybrid:  # Qwen3.5: the output is gated per element by sigmoid(x @ gate)
            self.gate = param(rngs, (d, h, hd), ("embed", "q_heads", "head_dim"), dtype)
        if cfg.attention_bias:
            self.q_bias = param(None, (h, hd), ("q_heads", "head_dim"), dtype, init="zeros")
            self.k_bias = param(None, (kv, hd), ("kv_heads", "head_dim"), dtype, init="zeros")
            self.v_bias = param(None, (kv, hd), ("kv_heads", "head_dim"), dtype, init="zeros")
            self.o_bias = param(None, (d,), ("embed",), dtype, init="zeros")
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, zero_centered=cfg.hybrid)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, zero_centered=cfg.hybrid)
        self.bias, self.theta, self.kv_heads = cfg.attention_bias, cfg.rope_theta, kv
        self.gated, self.rotary_dim = cfg.hybrid, cfg.rotary_dim
        self.attention, self.block = cfg.attention, cfg.attention_block
        self.query_blocks = cfg.causal_query_blocks

    def __call__(self, x, positions, segment_ids, cache_layer=None, cache_lengths=None):
        dt = x.dtype
        q = jnp.einsum("bsd,dhk->bshk", x, self.q[...].astype(dt))
        k = jnp.einsum("bsd,dhk->bshk", x, self.k[...].astype(dt))
        v = jnp.einsum("bsd,dhk->bshk", x, self.v[...].astype(dt))
        if self.bias:
            q, k, v = q + self.q_bias[...].astype(dt), k + self.k_bias[...].astype(dt), \
                v + self.v_bias[...].astype(dt)
        q = rope(self.q_norm(q), positions, self.theta, self.rotary_dim)
        k = rope(self.k_norm(k), positions, self.theta, self.rotary_dim)
        q = constrain(q, ("batch", "length", "q_heads", "head_dim"))
        if cache_layer is None:
            new_layer, keys, values = None, k, v
            key_positions, key_segments, query_segments = positions, segment_ids, segment_ids
        else:
            new_layer, keys, values, key_positions, key_valid = write_and_read(
                cache_layer, k, v, positions, segment_ids, cache_lengths)
            key_segments = key_valid.astype(jnp.int32)  # one segment: the row's valid keys
            query_segments = jnp.ones_like(positions)
        with jax.named_scope("scores"):  # q.k, mask, softmax, weighted values
            if use_flash(self.attention, q.shape[1], keys.shape[1]):
                out = flash_attention(q, keys, values, positions, query_segments, key_positions,
                                      key_segments, block_q=self.block, block_k=self.block,
                                      index_causal=cache_layer is None)
            else:
                mask = ((query_segments[:, :, None] == key_segments[:, None, :])
                        & (key_positions[:, None, :] <= positions[:, :, None]))
                if cache_layer is None:  # training rows (and cacheless prefill): index-causal
                    mask = mask & (segment_ids[:, :, None] > 0)
                    out = attend_causal(q, keys, values, mask, self.kv_heads,
                                        self.query_blocks)
                else:
                    out = attend(q, keys, values, mask, self.kv_heads)
        if self.gated:
            gate = jnp.einsum("bsd,dhk->bshk", x, self.gate[...].astype(dt))
            out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(dt)
        out = jnp.einsum("bshk,hkd->bsd", out, self.o[...].astype(dt))
        if self.bias:
            out = out + self.o_bias[...].astype(dt)
        return out, new_layer


def use_flash(attention: str, queries: int, keys: int) -> bool:
    """"flash" (blockwise, O(S) memory), "naive" (one [S, T] score matrix: exact for every test
    reference), or "auto": flash once the score matrix per head and row reaches 2048 x 2048."""
    if attention == "auto":
        return queries > 1 and queries * keys >= 2048 * 2048
    return attention == "flash"


def attend(q, k, v, mask_bst, kv_heads: int):
    """Grouped-query attention with float32 scores and softmax."""
    b, s, h, hd = q.shape
    q = q.reshape(b, s, kv_heads, h // kv_heads, hd)
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k, preferred_element_type=jnp.float32)
    scores = scores * (hd ** -0.5)
    scores = jnp.where(mask_bst[:, None, None], scores, NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgst,btkd->bskgd", probs.astype(v.dtype), v)
    return out.reshape(b, s, h, hd)


MIN_QUERY_BLOCK = 32  # smaller blocks cost more in per-block overhead than they skip


def query_block_edges(length: int, blocks: int) -> list[int]:
    """Where attend_causal cuts `length` queries: `blocks` near-equal pieces of at least
    MIN_QUERY_BLOCK (fewer when the row is short; one piece = the whole score matrix)."""
    n = max(1, min(blocks, length // MIN_QUERY_BLOCK))
    return [round(length * i / n) for i in range(n + 1)]


def attend_causal(q, k, v, mask_bst, kv_heads: int, blocks: int):
    """`attend` for index-causal rows (query index i never sees key index j > i: packed
    training rows, whose segments are contiguous and whose positions ascend inside each), with
    the queries cut into blocks that score only the keys up to their own end.

    Why: the naive path computes, masks and differentiates the whole [S, T] score matrix, and
    on CPU that is most of a training step (64% of the main job's SFT step at 384-token rows);
    the skipped keys are the ones the mask removes, so every query's softmax is the same.
    Each block is a plain `attend` (no loops: XLA fuses each as before); 4 blocks score 5/8 of
    the square (experiments/benchmarks/causal_attention.py: SFT step 1.36x, PPO step 1.59x).
    A query that sees no key at all (padding) averages fewer values than `attend` would: its
    output is never read."""
    edges = query_block_edges(q.shape[1], blocks)
    if len(edges) == 2 or q.shape[1] != k.shape[1]:
        return attend(q, k, v, mask_bst, kv_heads)
    return jnp.concatenate(
        [attend(q[:, a:b], k[:, :b], v[:, :b], mask_bst[:, a:b, :b], kv_heads)
         for a, b in zip(edges[:-1], edges[1:])], axis=1)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, index: int, dtype, rngs: nnx.Rngs):
        self.is_linear = cfg.is_linear_layer(index)
        self.attn = (GatedDeltaNet(cfg, dtype, rngs) if self.is_linear
                     else Attention(cfg, dtype, rngs))
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, cfg.hybrid)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, cfg.hybrid)
        if cfg.shared_expert_intermediate_size:  # Qwen3.5: always on, gated per token
            self.shared = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size, dtype, rngs)
            self.shared_gate = param(rngs, (cfg.hidden_size, 1), ("embed", None), dtype)
        self.has_shared = bool(cfg.shared_expert_intermediate_size)
        self.is_moe = cfg.is_moe_layer(index)
        if self.is_moe:
            self.mlp = MoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts,
                           cfg.num_experts_per_tok, cfg.norm_topk_prob, dtype, rngs,
                           dispatch=cfg.moe_dispatch, token_chunk=cfg.moe_token_chunk,
                           sharding=cfg.moe_sharding)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, dtype, rngs)

    def __call__(self, x, positions, segment_ids, route_indices=None, cache_layer=None,
                 cache_lengths=None):
        # named scopes (HLO metadata only) attribute a profile's ops to the model's parts:
        # experiments/benchmarks/step_profile.py
        with jax.named_scope("norm"):
            normed = self.input_norm(x)
        with jax.named_scope("linear_attention" if self.is_linear else "attention"):
            if self.is_linear:
                h, new_layer = self.attn(normed, segment_ids, cache_layer, cache_lengths)
            else:
                h, new_layer = self.attn(normed, positions, segment_ids, cache_layer,
                                         cache_lengths)
        x = x + h
        with jax.named_scope("norm"):
            normed = self.post_attn_norm(x)
        b, s, d = x.shape
        with jax.named_scope("moe" if self.is_moe else "mlp"):
            if self.is_moe:
                flat = None if route_indices is None else route_indices.reshape(b * s, -1)
                y, routing, aux, free = self.mlp(normed.reshape(b * s, d), flat,
                                                 (segment_ids > 0).reshape(-1))
                y, indices = y.reshape(b, s, d), routing.indices.reshape(b, s, -1)
                free = free.reshape(b, s, -1)
            else:
                y, indices, aux, free = self.mlp(normed), None, None, None
            if self.has_shared:
                weight = jax.nn.sigmoid((normed @ self.shared_gate[...].astype(normed.dtype))
                                        .astype(jnp.float32)).astype(normed.dtype)
                y = y + weight * self.shared(normed)
        x = constrain(x + y, ("batch", "length", "embed"))
        return x, (indices, free), aux, new_layer


class Transformer(nnx.Module):
    """Embedding, decoder layers and the final norm: the backbone both heads share."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
        layers = [DecoderLayer(cfg, i, dtype, rngs) for i in range(cfg.num_hidden_layers)]
        start, period = scan_plan(cfg)  # scan_layers: the repeating layers are stored stacked
        self.layers = nnx.List(layers[:start])
        self.blocks = nnx.List([stack_layers(layers[start + j::period]) for j in range(period)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, cfg.hybrid)

    def layer(self, i: int) -> nnx.Module:
        """Layer i as its own module (a view into the stacked blocks past the unstacked ones)."""
        (_, j), r = layer_slot(self.cfg, i)
        return self.layers[i] if r is None else unstacked(self.blocks[j], r)

    def __call__(self, tokens, positions=None, segment_ids=None, routes=None, cache=None):
        cfg = self.cfg
        b, s = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
        if segment_ids is None:
            segment_ids = jnp.ones((b, s), jnp.int32)
        compute = jnp.dtype(cfg.compute_dtype)
        x = jnp.take(self.embed[...], tokens, axis=0).astype(compute)
        x = constrain(x, ("batch", "length", "embed"))
        k = cfg.num_experts_per_tok
        used, free_used, aux_losses, new_layers = [], [], [], []
        none = jnp.full((b, s, k), -1, jnp.int32)
        train = cache is None
        if cfg.remat and train:
            remat_layer = nnx.remat(
                lambda layer, x, *args: layer(checkpoint_name(x, LAYER_INPUT), *args),
                policy=remat_policy(cfg.offload_layer_inputs))
        start = len(self.layers)  # a cache holds one entry per layer: unrolled, every layer
        for i in range(start if train else cfg.num_hidden_layers):
            layer = self.layer(i)
            replay = None if routes is None else routes[:, :, i, :]
            if cfg.remat and train:
                x, (indices, free), aux, new_layer = remat_layer(layer, x, positions,
                                                                 segment_ids, replay)
            else:
                x, (indices, free), aux, new_layer = layer(
                    x, positions, segment_ids, replay,
                    None if cache is None else cache.layers[i],
                    None if cache is None else cache.lengths)
            used.append(none if indices is None else indices)
            free_used.append(none if free is None else free)
            if aux is not None:
                aux_losses.append(aux)
            new_layers.append(new_layer)
        if train and len(self.blocks):
            x, scanned, aux = scan_layers(self.blocks, x, positions, segment_ids,
                                          None if routes is None else routes[:, :, start:],
                                          cfg.remat, k, cfg.offload_layer_inputs)
            used.append(scanned[0])
            free_used.append(scanned[1])
            aux_losses.extend(aux)
        stack = lambda parts: jnp.concatenate([p if p.ndim == 4 else p[:, :, None] for p in parts],
                                              axis=2)  # noqa: E731
        routes_out = (stack(used), stack(free_used))
        aux_loss = (jnp.mean(jnp.concatenate([jnp.ravel(a) for a in aux_losses]))
                    if aux_losses else jnp.zeros((), jnp.float32))
        new_cache = None if cache is None else cache.replace_layers(new_layers, positions,
                                                                   segment_ids)
        return self.norm(x), routes_out, aux_loss, new_cache  # routes_out: (used, free)


class CausalLM(nnx.Module):
    """The policy: backbone + LM head (tied to the embedding where the config says so)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.model = Transformer(cfg, rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"),
                                 jnp.dtype(cfg.param_dtype))
        self.tied = cfg.tie_word_embeddings

    def head(self) -> jax.Array:
        """The LM head [hidden, vocab]."""
        return self.model.embed[...].T if self.tied else self.lm_head[...]

    def __call__(self, tokens, positions=None, segment_ids=None, routes=None,
                 cache=None, logits: bool = True) -> ModelOutput:
        """logits=False returns the normed hidden states instead of the float32 logits, for
        callers that reduce over the vocabulary in chunks (t1jax.rl.token_stats)."""
        h, (routes_out, free), aux, new_cache = self.model(tokens, positions, segment_ids, routes,
                                                           cache)
        if not logits:
            return ModelOutput(None, None, routes_out, aux, new_cache, free, hidden=h)
        with jax.named_scope("lm_head"):
            out = jnp.einsum("bsd,dv->bsv", h, self.head().astype(h.dtype),
                             preferred_element_type=jnp.float32)
        out = constrain(out, ("batch", "length", "vocab"))
        return ModelOutput(out, None, routes_out, aux, new_cache, free)


class ValueModel(nnx.Module):
    """The critic: the same backbone with a scalar value head (float32).

    The head starts at zero, so a fresh critic predicts 0 everywhere (explained variance ~0)
    instead of per-token noise as large as the returns' spread, which whitened advantages would
    pass straight into the policy gradient (measured in the tiny recipe: a random head kept
    explained variance at -0.3..-1.6 and PPO collapsed the policy to not calling tools)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.model = Transformer(cfg, rngs)
        self.value_head = param(None, (cfg.hidden_size,), ("embed",), jnp.float32, init="zeros")
        self.value_bias = param(None, (), (), jnp.float32, init="zeros")

    def __call__(self, tokens, positions=None, segment_ids=None, routes=None,
                 cache=None) -> ModelOutput:
        h, (routes_out, free), aux, new_cache = self.model(tokens, positions, segment_ids, routes,
                                                           cache)
        values = h.astype(jnp.float32) @ self.value_head[...] + self.value_bias[...]
        return ModelOutput(None, values, routes_out, aux, new_cache, free)


def log_probs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log p(target) in float32 under softmax(logits / temperature)."""
    scaled = logits.astype(jnp.float32) / temperature
    logz = jax.nn.logsumexp(scaled, axis=-1)
    return jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0] - logz
