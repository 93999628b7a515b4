"""Dropless expert computation for a top-k MoE layer (Qwen3-MoE SwiGLU experts).

Why: the router picks k experts per token; how the T*k (token, expert) assignments reach the
expert weights decides speed and memory, and the best way differs per backend. Every strategy
here computes the same function, never drops a token (no capacity overflow), is jit-able with
static shapes, and is differentiable w.r.t. x, the gate weights (the router learns through
them) and all three expert weight tensors.

    y[t] = sum_j weights[t, j] * (silu(x[t] @ w_gate[e]) * (x[t] @ w_up[e])) @ w_down[e],
    e = indices[t, j];  an index of -1 means "no expert" and contributes nothing.

Strategies:
  ragged  sort assignments by expert, jax.lax.ragged_dot per group; T*k rows of expert FLOPs.
  padded  sort by expert into an [E, C=T, D] buffer (dropless capacity), batched einsum.
          Same FLOPs as dense (E*T rows) plus the scatter/gather; kept as the portable
          fixed-shape layout (e.g. for expert-parallel all-to-all), not for speed.
  dense   every expert on every token, combined with a dense [T, E] weight matrix; E/k times
          the FLOPs but no gather/scatter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Measured with experiments/benchmarks/moe_dispatch.py (fwd+bwd, D=256, F=128, k=8).
# cpu: see _auto_cpu. gpu/tpu: "ragged" (grouped-matmul kernels exist there) — NOT measured here.
AUTO = {"cpu": "ragged", "gpu": "ragged", "tpu": "ragged"}
STRATEGIES = ("ragged", "padded", "dense")


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
        flat = indices_tk.reshape(-1).astype(jnp.int32)
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
    # carry expert index E (out of bounds) and are dropped by the scatter / filled by the gather.
    pos = jnp.arange(s.perm.shape[0], dtype=jnp.int32) - starts[jnp.minimum(s.expert, e - 1)]
    pos = jnp.where(s.valid, pos, t)
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


_IMPLS = {"ragged": expert_ffn_ragged, "padded": expert_ffn_padded, "dense": expert_ffn_dense}


def _auto_cpu(num_experts: int, k: int) -> str:
    """CPU choice from the benchmark; see AUTO."""
    return AUTO["cpu"]


def resolve_strategy(strategy: str, num_experts: int | None = None, k: int | None = None) -> str:
    """Map "auto" to a concrete strategy for the default backend; validate names."""
    if strategy == "auto":
        backend = jax.default_backend()
        if backend == "cpu" and num_experts is not None and k is not None:
            return _auto_cpu(num_experts, k)
        return AUTO.get(backend, "ragged")
    if strategy not in _IMPLS:
        raise ValueError(f"unknown MoE dispatch strategy {strategy!r}; choose from {STRATEGIES} or 'auto'")
    return strategy


def expert_ffn(x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd, *, strategy: str = "auto"):
    """y[t] = sum_j weights[t,j] * SwiGLU_{indices[t,j]}(x[t]); -1 indices contribute nothing."""
    t, d = x_td.shape
    e, d2, f = w_gate_edf.shape
    assert d2 == d and w_up_edf.shape == (e, d, f) and w_down_efd.shape == (e, f, d), (
        x_td.shape, w_gate_edf.shape, w_up_edf.shape, w_down_efd.shape)
    assert indices_tk.shape == weights_tk.shape and indices_tk.shape[0] == t, (indices_tk.shape, weights_tk.shape)
    name = resolve_strategy(strategy, e, indices_tk.shape[1])
    return _IMPLS[name](x_td, indices_tk, weights_tk, w_gate_edf, w_up_edf, w_down_efd)


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
