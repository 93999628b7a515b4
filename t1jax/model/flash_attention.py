"""Memory-efficient ("flash") attention in pure JAX: blockwise scores with an online softmax, and a
`jax.custom_vjp` whose backward recomputes the scores block by block.

Why: the naive `attend` materialises float32 scores [B, kv_heads, group, S, T], about 100+ GB per
chip for a 32k-token row. Here only one [B, H, block_q, block_k] tile of scores exists at a time;
everything kept across tiles (the running max / sum / output accumulator, the gradients) is O(S).

Loop structure: one `lax.scan` over a static list of (query block, key block) pairs, the whole
per-query state (m, l, acc; or dq, dk, dv in the backward) in the carry and each step reading and
writing its blocks with dynamic slices. With `index_causal` the pairs whose key block lies wholly
after the query block are left out of the list, so they cost nothing, not even in XLA's counted
FLOPs (a `lax.cond` would still be counted), and the trip count stays static. Plain XLA, no Pallas,
so it compiles for TPU and runs on CPU; the loops run over sequence blocks only, so B and the heads
can be sharded freely.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

NEG_INF = -1e30  # finite: exp(NEG_INF - NEG_INF) is 1, not NaN; masked terms are zeroed explicitly


def block_pairs(num_q_blocks: int, num_k_blocks: int, block_q: int, block_k: int,
                index_causal: bool) -> list[tuple[int, int]]:
    """The (query block, key block) pairs the scans visit, query-block major. With index_causal a
    key block is skipped when its first index is after the query block's last one."""
    return [(i, j) for i in range(num_q_blocks) for j in range(num_k_blocks)
            if not index_causal or j * block_k <= i * block_q + block_q - 1]


def _tile(q, k, qpos, qseg, kpos, kseg, i, j, bq, bk):
    """Masked float32 scores [B, KV, G, bq, bk] of query block i against key block j, the mask,
    and the blocks read. q [B, KV, G, S, D], k [B, KV, T, D], positions / segments [B, S|T]."""
    qs, ks = i * bq, j * bk
    qb = lax.dynamic_slice_in_dim(q, qs, bq, 3)
    kb = lax.dynamic_slice_in_dim(k, ks, bk, 2)
    qp, qg = (lax.dynamic_slice_in_dim(x, qs, bq, 1)[:, :, None] for x in (qpos, qseg))
    kp, kg = (lax.dynamic_slice_in_dim(x, ks, bk, 1)[:, None, :] for x in (kpos, kseg))
    mask = ((qg == kg) & (qg > 0) & (kp <= qp))[:, None, None]
    s = jnp.einsum("bkgqd,bktd->bkgqt", qb, kb, preferred_element_type=jnp.float32)
    s = jnp.where(mask, s * (q.shape[-1] ** -0.5), NEG_INF)
    return s, mask, qb, kb


def _in_loop(index, carry):
    """`index` (positions, segments) routed through an optimization barrier with the loop
    carry. Why: the masks depend on the loop only through the pair index, so XLA's TPU compiler
    hoists them out of the scan for all pairs at once and keeps them, [pairs, B, KV, G, bq, bk]
    booleans: 16 GB per chip for Qwen3-30B-A3B at a 32k-token row, the largest temporary of the
    training step (experiments/aot_compile.py). Behind the barrier each step builds its own."""
    return lax.optimization_barrier((index, carry))


def _forward(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal):
    """Output [B, KV, G, S, D] in q.dtype and logsumexp [B, KV, G, S] (0 where no key is seen)."""
    pairs = jnp.asarray(block_pairs(q.shape[3] // bq, k.shape[2] // bk, bq, bk, causal), jnp.int32)

    def step(carry, pair):
        (qpos_, qseg_, kpos_, kseg_), (acc, m, l) = _in_loop((qpos, qseg, kpos, kseg), carry)
        i, j = pair[0], pair[1]
        s, mask, _, _ = _tile(q, k, qpos_, qseg_, kpos_, kseg_, i, j, bq, bk)
        vb = lax.dynamic_slice_in_dim(v, j * bk, bk, 2)
        m_old, l_old, acc_old = (lax.dynamic_slice_in_dim(x, i * bq, bq, 3) for x in (m, l, acc))
        m_new = jnp.maximum(m_old, s.max(-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m_old - m_new)
        pv = jnp.einsum("bkgqt,bktd->bkgqd", p.astype(v.dtype), vb,
                        preferred_element_type=jnp.float32)
        updates = (acc_old * corr[..., None] + pv, m_new, l_old * corr + p.sum(-1))
        return tuple(lax.dynamic_update_slice_in_dim(x, u, i * bq, 3)
                     for x, u in zip((acc, m, l), updates)), None

    stats = jnp.full(q.shape[:-1], NEG_INF, jnp.float32), jnp.zeros(q.shape[:-1], jnp.float32)
    (acc, m, l), _ = lax.scan(step, (jnp.zeros(q.shape, jnp.float32), *stats), pairs)
    seen = l > 0
    out = acc / jnp.where(seen, l, 1.0)[..., None]  # a query that sees no key: acc = 0, out = 0
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _flash(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal):
    return _forward(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal)[0]


def _flash_fwd(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal):
    out, lse = _forward(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal)
    return out, (q, k, v, qpos, qseg, kpos, kseg, out, lse)


def _flash_bwd(bq, bk, causal, res, dout):
    """The flash-attention backward: per tile, p = exp(s - lse), dV += p^T dO, dS = p (dO V^T -
    delta) with delta = rowsum(dO * O), dQ += dS K, dK += dS^T Q (both scaled). dK / dV sum over
    the query heads of each group through the einsums' g contraction."""
    q, k, v, qpos, qseg, kpos, kseg, out, lse = res
    scale = q.shape[-1] ** -0.5
    delta = (dout.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1)
    pairs = jnp.asarray(block_pairs(q.shape[3] // bq, k.shape[2] // bk, bq, bk, causal), jnp.int32)

    def step(carry, pair):
        (qpos_, qseg_, kpos_, kseg_), (dq, dk, dv) = _in_loop((qpos, qseg, kpos, kseg), carry)
        i, j = pair[0], pair[1]
        s, mask, qb, kb = _tile(q, k, qpos_, qseg_, kpos_, kseg_, i, j, bq, bk)
        vb = lax.dynamic_slice_in_dim(v, j * bk, bk, 2)
        dob, lse_b, delta_b = (lax.dynamic_slice_in_dim(x, i * bq, bq, 3)
                               for x in (dout, lse, delta))
        p = jnp.where(mask, jnp.exp(s - lse_b[..., None]), 0.0)
        dp = jnp.einsum("bkgqd,bktd->bkgqt", dob, vb, preferred_element_type=jnp.float32)
        ds = p * (dp - delta_b[..., None])
        dv_b = jnp.einsum("bkgqt,bkgqd->bktd", p.astype(dout.dtype), dob,
                          preferred_element_type=jnp.float32)
        dq_b = jnp.einsum("bkgqt,bktd->bkgqd", ds.astype(k.dtype), kb,
                          preferred_element_type=jnp.float32) * scale
        dk_b = jnp.einsum("bkgqt,bkgqd->bktd", ds.astype(q.dtype), qb,
                          preferred_element_type=jnp.float32) * scale
        dq = lax.dynamic_update_slice_in_dim(
            dq, lax.dynamic_slice_in_dim(dq, i * bq, bq, 3) + dq_b, i * bq, 3)
        dk, dv = (lax.dynamic_update_slice_in_dim(x, lax.dynamic_slice_in_dim(x, j * bk, bk, 2) + u,
                                                  j * bk, 2) for x, u in ((dk, dk_b), (dv, dv_b)))
        return (dq, dk, dv), None

    zeros = tuple(jnp.zeros(x.shape, jnp.float32) for x in (q, k, v))
    (dq, dk, dv), _ = lax.scan(step, zeros, pairs)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, q_positions, q_segment_ids, k_positions, k_segment_ids, *,
                    block_q: int = 512, block_k: int = 512, index_causal: bool = False):
    """q [B, S, H, D], k/v [B, T, KV, D] (H a multiple of KV: grouped-query), positions/segment
    ids int32 [B, S] / [B, T]. Query i sees key j iff q_segment_ids[i] == k_segment_ids[j] and
    q_segment_ids[i] > 0 and k_positions[j] <= q_positions[i]. Scores and softmax in float32,
    scaled by D**-0.5; returns [B, S, H, D] in q.dtype; a query that sees no key gets 0.
    index_causal=True promises S == T and that query index i never sees a key index j > i
    (true for packed training rows: segments are contiguous, positions ascend inside each), so
    key blocks after the query block are skipped statically (about half the FLOPs)."""
    b, s, h, d = q.shape
    t, kv = k.shape[1], k.shape[2]
    if h % kv:
        raise ValueError(f"{h} query heads are not a multiple of {kv} key/value heads")
    if index_causal and s != t:
        raise ValueError(f"index_causal needs as many queries as keys, got {s} and {t}")
    bq, bk = min(block_q, s), min(block_k, t)
    ps, pt = -s % bq, -t % bk
    # Padding queries have segment 0 (they see nothing), padding keys -1 (no query has it).
    pad = lambda x, n, value=0: jnp.pad(x, [(0, 0), (0, n)] + [(0, 0)] * (x.ndim - 2),
                                        constant_values=value)
    qq = pad(q, ps).reshape(b, s + ps, kv, h // kv, d).transpose(0, 2, 3, 1, 4)
    kk, vv = (pad(x, pt).transpose(0, 2, 1, 3) for x in (k, v))
    out = _flash(qq, kk, vv, pad(q_positions.astype(jnp.int32), ps),
                 pad(q_segment_ids.astype(jnp.int32), ps), pad(k_positions.astype(jnp.int32), pt),
                 pad(k_segment_ids.astype(jnp.int32), pt, -1), bq, bk, index_causal)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, s + ps, h, d)[:, :s]
