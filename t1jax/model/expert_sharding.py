"""The expert FFN on a device mesh: every device dispatches its own tokens; the expert FFN width
stays split over `tensor`. Two ways to bring tokens and experts together (`moe_sharding`):

  gather_weights  experts stored sharded, gathered whole one layer at a time (ZeRO-3 style)
  gather_tokens   expert parallelism: each device keeps its block of experts (gathered only
                  over the other axes, e.g. `fsdp`), gathers the tokens of the devices that
                  split the experts, runs its own experts on all of them and reduce-scatters
                  the partial outputs back. No capacity, no dropped tokens.

Why: left to GSPMD, the dispatch's global sort over all T*k assignments cannot be partitioned,
so XLA replicates every token on every chip and computes the whole batch's expert work there (a
TPU v5p-64 compile of Qwen3-30B-A3B measured 222 GB of temporaries per chip at 512 tokens per
chip). Inside `shard_map` the sort, the grouped matmuls and the combine are local; the only
collectives are the all-gather of this layer's expert weights (its transpose, a reduce-scatter,
sums their gradients) and a psum over `tensor` when the FFN width is split.
Cost: each chip receives the layer's full expert weights per forward (and again in the backward
under remat). That is cheap against the matmuls at the long rows RL trains on (the compile
report of the recipe's aot phase, t1jax/jobs/aot.py, prints the collective bytes); token all-to-all expert
parallelism, which moves T*k activations instead, is not implemented.
gather_tokens moves the tokens instead: per layer and device, (expert-axis size - 1) x its own
tokens in and the same partial outputs back, and only 1/(expert-axis size) of the layer's expert
weights. The exchange runs a chunk at a time (moe_token_chunk tokens gathered), so its buffers do
not grow with the row: gathered whole, a 64k-token row per chip over 8 expert devices made
3 GiB buffers of 512k tokens, ~25 of them alive in the T1 setting's compile. What it costs: each device's dispatch runs over all gathered tokens' assignments, most
of them to other devices' experts (-1 here, sorted past the ragged groups; whether a TPU grouped
matmul skips those rows is not measured).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from t1jax import sharding
from t1jax.model.config import MOE_SHARDINGS
from t1jax.model.dispatch import expert_ffn

try:  # jax.lax in newer JAX releases; only private in the 0.10.2 we pin
    from jax.lax import all_gather_invariant
except ImportError:
    from jax._src.lax.parallel import all_gather_invariant

_UP = ("expert", "embed", "expert_mlp")  # gate and up: [E, D, F]
_DOWN = ("expert", "expert_mlp", "embed")  # down: [E, F, D]


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _gather(w, spec: P, keep: tuple[int, ...], token_axes: tuple[str, ...]):
    """All-gather every sharded dimension of a local weight block except dimensions `keep`.
    Over axes the tokens are split on, a plain all-gather: its transpose is a reduce-scatter
    of the gradient. Over any other axis (rows that do not divide it), an invariant gather, so
    the output is typed as replicated there, as it is."""
    for dim, entry in enumerate(spec):
        axes = _axes(entry)
        if dim not in keep and axes:
            gather = jax.lax.all_gather if set(axes) <= set(token_axes) else all_gather_invariant
            w = gather(w, axes, axis=dim, tiled=True)
    return w


def _in_chunks(fn, chunk: int, x_td, indices_tk, weights_tk):
    """fn(x, indices, weights) -> [t, D] over at most `chunk` tokens at a time (lax.map; a
    token's output depends on that token alone, so this is the same function). Padding tokens
    get expert -1 and contribute nothing."""
    t = x_td.shape[0]
    if t <= chunk:
        return fn(x_td, indices_tk, weights_tk)
    n = -(-t // chunk)
    pad = n * chunk - t
    x = jnp.pad(x_td, ((0, pad), (0, 0))).reshape(n, chunk, -1)
    idx = jnp.pad(indices_tk, ((0, pad), (0, 0)), constant_values=-1).reshape(n, chunk, -1)
    w = jnp.pad(weights_tk, ((0, pad), (0, 0))).reshape(n, chunk, -1)
    # checkpoint: the backward keeps each chunk's inputs, not its [chunk * k, ...] buffers
    # (costs one more forward of the expert FFN per chunk in the backward pass)
    y = jax.lax.map(jax.checkpoint(lambda a: fn(*a)), (x, idx, w))
    return y.reshape(n * chunk, -1)[:t]


def chunked_expert_ffn(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd, *,
                       strategy: str, chunk: int):
    """`dispatch.expert_ffn` over at most `chunk` tokens at a time. Why: the dispatch buffers
    are [tokens * k, ...] in float32, and at 32k-64k tokens per device those of one pass (the
    grouped matmuls' outputs and, on TPU, their per-expert masks in the backward) reach tens of
    GB."""
    return _in_chunks(lambda x, i, w: expert_ffn(x, i, w, w_gate_edf, w_up_edf, w_down_efd,
                                                 strategy=strategy), chunk, x_td, indices_tk,
                      weights_tk)


def _block_index(axes: tuple[str, ...]):
    """This device's block number along a dimension split over `axes` (major to minor)."""
    index = 0
    for a in axes:
        index = index * jax.lax.axis_size(a) + jax.lax.axis_index(a)
    return index


def expert_ffn_sharded(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd, *,
                       strategy: str, chunk: int = 1 << 30, mode: str = "gather_weights"):
    """`chunked_expert_ffn` under the active mesh (`jax.set_mesh`), each device on its own
    tokens, experts brought to them by `mode` (module docstring); the plain call without a
    mesh."""
    if mode not in MOE_SHARDINGS:
        raise ValueError(f"moe_sharding={mode!r}; supported: {', '.join(MOE_SHARDINGS)}")
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.size == 1:
        return chunked_expert_ffn(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf,
                                  w_down_efd, strategy=strategy, chunk=chunk)
    shape = dict(mesh.shape)
    rows = sharding.spec_for(("batch", None), x_td.shape, shape)
    up = sharding.spec_for(_UP, w_gate_edf.shape, shape)
    down = sharding.spec_for(_DOWN, w_down_efd.shape, shape)
    width = _axes(up[2])  # the FFN width's axes: the same split for gate/up (dim 2), down (dim 1)
    if _axes(down[1]) != width:
        raise ValueError(f"expert gate/up width split {up} differs from down's {down}")
    if _axes(down[0]) != _axes(up[0]):
        raise ValueError(f"expert gate/up expert split {up} differs from down's {down}")
    token_spec = P(rows[0], None)
    token_axes = _axes(rows[0])
    # gather_tokens: the experts stay split over these axes; tokens split over them are
    # gathered, tokens replicated over them (rows that do not divide) are already here
    split = _axes(up[0]) if mode == "gather_tokens" else ()
    over_tokens = tuple(a for a in split if a in token_axes)
    replicated = tuple(a for a in split if a not in token_axes)

    def local(x, idx, w, wg, wu, wd):
        experts = (0,) if split else ()  # the expert dimension stays split under gather_tokens
        wg, wu = (_gather(v, up, experts + (2,), token_axes) for v in (wg, wu))
        wd = _gather(wd, down, experts + (1,), token_axes)
        first = _block_index(split) * wg.shape[0] if split else 0

        def own_experts(x, idx, w):
            """This device's experts on tokens x; other experts' assignments become -1."""
            if split:
                mine = (idx >= first) & (idx < first + wg.shape[0])
                idx = jnp.where(mine, idx - first, -1)
            return expert_ffn(x, idx, w, wg, wu, wd, strategy=strategy)

        def exchange(x, idx, w):
            """A chunk of every expert-group device's tokens in, this device's partial sums
            over its experts back to each token's owner."""
            x, idx, w = (jax.lax.all_gather(v, over_tokens, axis=0, tiled=True)
                         for v in (x, idx, w))
            return jax.lax.psum_scatter(own_experts(x, idx, w), over_tokens,
                                        scatter_dimension=0, tiled=True)

        if over_tokens:  # gathered chunks stay at `chunk` tokens: chunk / group size per device
            group = 1
            for a in over_tokens:
                group *= jax.lax.axis_size(a)
            y = _in_chunks(exchange, max(1, chunk // group), x, idx, w)
        else:
            y = _in_chunks(own_experts, chunk, x, idx, w)
        sums = width + replicated
        return jax.lax.psum(y, sums) if sums else y

    return jax.shard_map(local, in_specs=(token_spec, token_spec, token_spec, up, up, down),
                         out_specs=token_spec)(x_td, indices_tk, weights_tk, w_gate_edf,
                                               w_up_edf, w_down_efd)
