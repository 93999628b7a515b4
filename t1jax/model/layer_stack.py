"""The repeating decoder layers stored stacked and run under lax.scan (`ModelConfig.scan_layers`):
which layers repeat, where each layer's parameters live, stacking and unstacking them, and the
scan itself with its remat policy.

Separate from transformer.py, which defines the layers: this is storage and control flow over
any same-kind layers, and it is what checkpoint import and export (t1jax.model.hf_io) need to
find layer i's parameters without building a model.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from t1jax.model.config import ModelConfig


def scan_plan(cfg: ModelConfig) -> tuple[int, int]:
    """(start, period) of `cfg.scan_layers`: layers[start:] are a block of `period` layers
    repeated at least twice (Qwen3: 1; Qwen3.5's three linear-attention layers and one full: 4);
    the earliest start, then the shortest period. (n, 0) when nothing repeats or the config does
    not scan. A layer's parameters are fixed by its kind (linear or full attention, MoE or dense
    MLP), so layers of one kind share a program."""
    n = cfg.num_hidden_layers
    if not cfg.scan_layers:
        return n, 0
    sigs = [(cfg.is_linear_layer(i), cfg.is_moe_layer(i)) for i in range(n)]
    for start in range(n - 1):
        for period in range(1, (n - start) // 2 + 1):
            if (n - start) % period == 0 and all(sigs[i] == sigs[i - period]
                                                  for i in range(start + period, n)):
                return start, period
    return n, 0


def layer_slot(cfg: ModelConfig, i: int) -> tuple[tuple, int | None]:
    """Where layer i's parameters live: (("layers", i), None) for an unstacked layer, or
    (("blocks", j), r) for repeat r of block position j, stored stacked (see `stack_layers`)."""
    start, period = scan_plan(cfg)
    if i < start:
        return ("layers", i), None
    r, j = divmod(i - start, period)
    return ("blocks", j), r


def stored_at(cfg: ModelConfig, path: tuple) -> tuple[tuple, int | None]:
    """Where the parameter with per-layer path (..., "layers", i, ...) (HF's numbering, and the
    layout without scan_layers) is stored in a model of `cfg`: its path there, and its index on
    the stacked leading axis (None: stored as is)."""
    for n in range(len(path) - 1):
        if path[n] == "layers" and isinstance(path[n + 1], int):
            slot, r = layer_slot(cfg, path[n + 1])
            return path[:n] + slot + path[n + 2:], r
    return path, None


def stack_layers(layers) -> nnx.Module:
    """One module holding same-kind layers' parameters stacked on a new leading axis (unsplit),
    each keeping its layer's layout: what lax.scan runs over. Stored this way, a training step
    neither re-stacks the weights on each forward nor holds per-layer gradients and optimizer
    moments: one array per block position instead of one per layer (a ~1000-leaf PPO step
    compiled ~3x faster for TPU; BUILD.md)."""
    graphdef, first = nnx.split(layers[0])
    states = [first] + [nnx.split(layer)[1] for layer in layers[1:]]

    def stack(*variables):
        names = variables[0].get_metadata().get("out_sharding")
        return variables[0].replace(jnp.stack([v.get_value() for v in variables]),
                                    out_sharding=None if names is None else (None,) + tuple(names))
    state = jax.tree.map(stack, *states, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return nnx.merge(graphdef, state)


def unstacked(block: nnx.Module, r: int) -> nnx.Module:
    """Repeat r of a stacked block, as an ordinary layer (the engine's per-layer cache path)."""
    graphdef, state = nnx.split(block)

    def take(v):
        names = v.get_metadata().get("out_sharding")
        return v.replace(v.get_value()[r], out_sharding=None if names is None else names[1:])
    return nnx.merge(graphdef, jax.tree.map(take, state,
                                            is_leaf=lambda v: isinstance(v, nnx.Variable)))


LAYER_INPUT = "layer_input"


def remat_policy(offload: bool):
    """What a rematerialised layer keeps for its backward pass: its input alone, on the chip, or
    (offload) in host memory, copied back when the backward pass reaches the layer."""
    if not offload:
        return None
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=[LAYER_INPUT],
        offload_src="device", offload_dst="pinned_host")


def scan_layers(blocks, x, positions, segment_ids, routes, remat: bool, k: int,
                offload: bool = False):
    """Run the stacked `blocks` (see `stack_layers`: a block of `period` layers, repeated) under
    lax.scan over the repeats; the gradient lands on the stacked parameters. Returns (x, (used,
    free) routes [B, S, n, k], [per-repeat MoE aux losses])."""
    b, s = x.shape[:2]
    period = len(blocks)
    graphdefs, stacked = zip(*(nnx.split(block) for block in blocks))
    repeats = jax.tree.leaves(stacked[0])[0].shape[0]
    if routes is not None:  # [B, S, n, k] -> [repeats, period, B, S, k]
        routes = jnp.moveaxis(routes.reshape(b, s, repeats, period, -1), (2, 3), (0, 1))

    def apply(graphdef, state, x, replay):
        return nnx.merge(graphdef, state)(checkpoint_name(x, LAYER_INPUT), positions,
                                          segment_ids, replay)

    calls = [jax.checkpoint(functools.partial(apply, g), prevent_cse=False,
                            policy=remat_policy(offload)) if remat
             else functools.partial(apply, g) for g in graphdefs]

    def body(x, xs):
        states, replay = xs
        used, free, aux = [], [], []
        for j in range(period):
            x, (indices, chosen), a, _ = calls[j](states[j], x,
                                                  None if replay is None else replay[j])
            dense = jnp.full((b, s, k), -1, jnp.int32)
            used.append(dense if indices is None else indices)
            free.append(dense if chosen is None else chosen)
            if a is not None:
                aux.append(a)
        return x, (jnp.stack(used), jnp.stack(free), jnp.stack(aux) if aux else None)

    x, (used, free, aux) = jax.lax.scan(body, x, (tuple(stacked), routes))
    merge = lambda r: jnp.moveaxis(r, (0, 1), (2, 3)).reshape(b, s, repeats * period, -1)  # noqa
    return x, (merge(used), merge(free)), ([] if aux is None else [aux])
