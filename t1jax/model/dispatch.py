"""Dropless expert computation for a top-k MoE layer (Qwen3-MoE SwiGLU experts).

Why: the router picks k experts per token; how the T*k (token, expert) assignments reach the
expert weights decides speed and memory, and the best way differs per backend. Every strategy
here computes the same function, never drops a token (no capacity overflow), is jit-able with
static shapes, and is differentiable w.r.t. x, the gate weights (the router learns through
them) and all three expert weight tensors.

    y[t] = sum_j weights[t, j] * (silu(x[t] @ w_gate[e]) * (x[t] @ w_up[e])) @ w_down[e],
    e = indices[t, j];  an index of -1 means "no expert" and contributes nothing.

Strategies (rows of expert work per matmul, T tokens, E experts, k per token):
  ragged   sort assignments by expert, jax.lax.ragged_dot per group: T*k rows where a grouped
           matmul kernel exists (GPU/TPU). On CPU, JAX lowers ragged_dot to a masked dense dot
           over all groups (E*T*k rows, and an [E, T*k, D] temporary): by far the slowest there.
  padded   sort by expert into an [E, C=T, D] buffer (dropless capacity), batched einsum.
           Same rows as dense (E*T) plus a scatter/gather; the fixed-shape per-expert layout.
  dense    every expert on every token, combined with a dense [T, E] weight matrix: E*T rows,
           E/k times the needed FLOPs, but no gather/scatter.
  blocked  expert-sorted rows in fixed-size single-expert tiles, one batched matmul over tiles
           with per-tile gathered weights: <= T*k + E*B rows. A grouped matmul from plain ops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# cpu: measured with experiments/benchmarks/moe_dispatch.py (fwd+bwd, D=256, F=128, k=8, 2 cores):
# "blocked" was fastest at E=16/64/128 (2-6x over padded/dense at E>=64), tied at E=k=8, and
# ragged (the masked-dense fallback) was the slowest everywhere. No E/k rule needed.
# gpu/tpu: "ragged" lowers to a real grouped matmul there; NOT measured here.
AUTO = {"cpu": "blocked", "gpu": "ragged", "tpu": "ragged"}
STRATEGIES = ("ragged", "padded", "dense", "blocked")


def _silu_mul(gate: jax.Array, up: jax.Array) -> jax.Array:
    """SwiGLU activation in float32 (inputs are the f32 matmul results)."""
    return jax.nn.silu(gate) * up


class _Sorted:
    """The T*k assignments sorted by expert; invalid (-1) ones sorted last (key E).

    Invalid assignments are excluded from the ragged groups (they sit past sum(group_sizes))
    and their contribution is masked to zero with `where`, so garbage rows can never leak.
    """

    def __init__(self, indices_tk: jax.Array, weights_tk: jax.Array, num_experts: int):
        t, k = indices_tk.shape
        flat = jnp.asarray(indices_tk).reshape(-1).astype(jnp.int32)
        valid = (flat >= 0) & (flat < num_experts)
        key = jnp.where(valid, flat, num_experts)
        self.perm = jnp.argsort(key, stable=True)
        self.expert = key[self.perm]  # E for invalid
        self.valid = valid[self.perm]
        self.token = self.perm // k
        self.weight = weights_tk.reshape(-1).astype(jnp.float32)[self.perm]
        self.group_sizes = jnp.bincount(jnp.where(valid, flat, 0), weights=valid.astype(jnp.int32),
                                        length=num_experts).astype(jnp.int32)
        n = t * k
        # Inverse permutation: unsort by a gather, then sum over k in a fixed order
        # (deterministic, unlike a float scatter-add on GPU).
        self.inv_perm = jnp.zeros((n,), jnp.int32).at[self.perm].set(jnp.arange(n, dtype=jnp.int32))
        self.shape = (t, k)

    def combine(self, out_nd: jax.Array) -> jax.Array:
        """Weight the sorted per-assignment outputs, unsort, sum over k -> float32 [T, D]."""
        contrib = jnp.where(self.valid[:, None], self.weight[:, None] * out_nd.astype(jnp.float32), 0.0)
        t, k = self.shape
        return contrib[self.inv_perm].reshape(t, k, -1).sum(axis=1)


def expert_ffn_ragged(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd):
    """Grouped matmuls over the expert-sorted assignments (T*k rows of work)."""
    s = _Sorted(indices_tk, weights_tk, w_gate_edf.shape[0])
    xs = x_td[s.token]
    gate = jax.lax.ragged_dot(xs, w_gate_edf, s.group_sizes, preferred_element_type=jnp.float32)
    up = jax.lax.ragged_dot(xs, w_up_edf, s.group_sizes, preferred_element_type=jnp.float32)
    h = _silu_mul(gate, up).astype(x_td.dtype)
    out = jax.lax.ragged_dot(h, w_down_efd, s.group_sizes, preferred_element_type=jnp.float32)
    return s.combine(out).astype(x_td.dtype)


def _merge_duplicate_experts(indices_tk, weights_tk):
    """Fold repeated experts within a token's row into its first occurrence (weights summed).

    Top-k never repeats an expert, but if a caller does, the padded layout's capacity C=T
    would overflow; merging keeps it dropless for any input. O(k^2) per token: cheap.
    """
    k = indices_tk.shape[1]
    valid = indices_tk >= 0
    eq = (indices_tk[:, :, None] == indices_tk[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    earlier = jnp.tril(jnp.ones((k, k), bool), -1)
    is_dup = (eq & earlier).any(axis=-1)
    merged_w = jnp.einsum("tij,tj->ti", eq.astype(jnp.float32), weights_tk.astype(jnp.float32))
    return jnp.where(is_dup, -1, indices_tk), jnp.where(is_dup, 0.0, merged_w)


def expert_ffn_padded(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd):
    """Per-expert batches padded to capacity C=T: dropless since an expert sees a token once."""
    e = w_gate_edf.shape[0]
    t = x_td.shape[0]
    indices_tk, weights_tk = _merge_duplicate_experts(indices_tk, weights_tk)
    s = _Sorted(indices_tk, weights_tk, e)
    starts = jnp.cumsum(s.group_sizes) - s.group_sizes
    # Slot within the expert's batch = rank among that expert's assignments; invalid ones
    # carry expert index E and are dropped by the scatter / zero-filled by the gather.
    pos = jnp.arange(s.perm.shape[0], dtype=jnp.int32) - starts[jnp.minimum(s.expert, e - 1)]
    # Invalid ones get (E, i): out of bounds, and unique, so unique_indices stays truthful.
    pos = jnp.where(s.valid, pos, jnp.arange(s.perm.shape[0], dtype=jnp.int32))
    buf = jnp.zeros((e, t, x_td.shape[1]), x_td.dtype).at[s.expert, pos].set(
        x_td[s.token], mode="drop", unique_indices=True)
    gate = jnp.einsum("ecd,edf->ecf", buf, w_gate_edf, preferred_element_type=jnp.float32)
    up = jnp.einsum("ecd,edf->ecf", buf, w_up_edf, preferred_element_type=jnp.float32)
    h = _silu_mul(gate, up).astype(x_td.dtype)
    out = jnp.einsum("ecf,efd->ecd", h, w_down_efd, preferred_element_type=jnp.float32)
    out_nd = out.at[s.expert, pos].get(mode="fill", fill_value=0.0)
    return s.combine(out_nd).astype(x_td.dtype)


def expert_ffn_dense(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd):
    """Every expert on every token; the [T, E] combine weights are folded into the down matmul."""
    e = w_gate_edf.shape[0]
    # one_hot of -1 (or any out-of-range id) is all zeros: invalid assignments vanish.
    combine_te = jnp.einsum("tk,tke->te", weights_tk.astype(jnp.float32),
                            jax.nn.one_hot(indices_tk, e, dtype=jnp.float32))
    gate = jnp.einsum("td,edf->tef", x_td, w_gate_edf, preferred_element_type=jnp.float32)
    up = jnp.einsum("td,edf->tef", x_td, w_up_edf, preferred_element_type=jnp.float32)
    h = (_silu_mul(gate, up) * combine_te[:, :, None]).astype(x_td.dtype)
    # One [T, E*F] @ [E*F, D] contraction: no [T, E, D] intermediate.
    y = jnp.einsum("tef,efd->td", h, w_down_efd, preferred_element_type=jnp.float32)
    return y.astype(x_td.dtype)


def _tile_rows(n: int, num_experts: int) -> int:
    """Rows per tile: about half an expert's mean load (a power of two in [8, 128])."""
    mean = max(1, n // num_experts)
    return int(min(128, max(8, (1 << (mean.bit_length() - 1)) // 2)))


def expert_ffn_blocked(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd, *,
                       tile_rows: int | None = None):
    """Expert-sorted assignments in fixed-size single-expert tiles, one batched matmul over tiles.

    A grouped matmul from plain ops (what ragged_dot is on GPU/TPU, minus the kernel): each
    expert's group is padded to a multiple of B rows, so work is at most T*k + E*B rows
    instead of dense's E*T. Tile count cdiv(T*k, B) + E - 1 bounds sum_e cdiv(n_e, B): static.
    Rows move by gathers (x rows in, output rows back); only an int index vector is scattered.
    """
    e = w_gate_edf.shape[0]
    t, k = indices_tk.shape
    n = t * k
    b = tile_rows or _tile_rows(n, e)
    num_tiles = -(-n // b) + e - 1
    s = _Sorted(indices_tk, weights_tk, e)
    tiles_e = (s.group_sizes + b - 1) // b
    tile_end = jnp.cumsum(tiles_e)
    group_start = jnp.cumsum(s.group_sizes) - s.group_sizes
    ec = jnp.minimum(s.expert, e - 1)
    row = (tile_end - tiles_e)[ec] * b + jnp.arange(n, dtype=jnp.int32) - group_start[ec]
    row = jnp.where(s.valid, row, num_tiles * b)  # padded-buffer row of each sorted assignment
    src_token = jnp.full((num_tiles * b,), t, jnp.int32).at[row].set(s.token, mode="drop")
    xb = x_td.at[src_token].get(mode="fill", fill_value=0).reshape(num_tiles, b, -1)
    # Tiles past the last used one compute zeros with expert E-1's weights (at most E-1 tiles).
    tile_expert = jnp.minimum(jnp.searchsorted(tile_end, jnp.arange(num_tiles), side="right"), e - 1)
    gate = jnp.einsum("nbd,ndf->nbf", xb, w_gate_edf[tile_expert], preferred_element_type=jnp.float32)
    up = jnp.einsum("nbd,ndf->nbf", xb, w_up_edf[tile_expert], preferred_element_type=jnp.float32)
    h = _silu_mul(gate, up).astype(x_td.dtype)
    out = jnp.einsum("nbf,nfd->nbd", h, w_down_efd[tile_expert], preferred_element_type=jnp.float32)
    out_tkd = out.reshape(num_tiles * b, -1).at[row[s.inv_perm].reshape(t, k)].get(mode="fill", fill_value=0)
    valid = (indices_tk >= 0) & (indices_tk < e)
    w = jnp.where(valid, weights_tk.astype(jnp.float32), 0.0)
    return jnp.einsum("tk,tkd->td", w, out_tkd).astype(x_td.dtype)


_IMPLS = {"ragged": expert_ffn_ragged, "padded": expert_ffn_padded, "dense": expert_ffn_dense,
          "blocked": expert_ffn_blocked}


def resolve_strategy(strategy: str, platform: str | None = None) -> str:
    """Map "auto" to the measured choice for `platform` (default: this process's backend; an
    ahead-of-time compile for TPU from a CPU host must name "tpu"); validate names."""
    if strategy == "auto":
        return AUTO.get(platform or jax.default_backend(), "ragged")
    if strategy not in _IMPLS:
        raise ValueError(f"unknown MoE dispatch strategy {strategy!r}; choose from {STRATEGIES} or 'auto'")
    return strategy


def expert_ffn(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd, *, strategy: str = "auto"):
    """y[t] = sum_j weights[t,j] * SwiGLU_{indices[t,j]}(x[t]); -1 indices contribute nothing."""
    t, d = x_td.shape
    e, d2, f = w_gate_edf.shape
    assert d2 == d and w_up_edf.shape == (e, d, f) and w_down_efd.shape == (e, f, d), (
        x_td.shape, w_gate_edf.shape, w_up_edf.shape, w_down_efd.shape)
    assert indices_tk.shape == weights_tk.shape and indices_tk.shape[0] == t, (
        indices_tk.shape, weights_tk.shape)
    args = (jnp.asarray(a) for a in (x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd))
    return _IMPLS[resolve_strategy(strategy)](*args)


def expert_ffn_loop_reference(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd) -> np.ndarray:
    """Plain float64 loop over tokens and k; the ground truth for tests only."""
    x, w, wg, wu, wd = (np.asarray(jnp.asarray(a, jnp.float32), np.float64)
                        for a in (x_td, weights_tk, w_gate_edf, w_up_edf, w_down_efd))
    idx = np.asarray(indices_tk)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            if e < 0:
                continue
            g = x[t] @ wg[e]
            h = g / (1.0 + np.exp(-g)) * (x[t] @ wu[e])
            y[t] += w[t, j] * (h @ wd[e])
    return y
