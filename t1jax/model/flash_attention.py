"""Memory-efficient ("flash") attention in pure JAX: blockwise scores with an online softmax, and a
`jax.custom_vjp` whose backward recomputes the scores block by block.

Why: the naive `attend` materialises float32 scores [B, kv_heads, group, S, T], about 100+ GB per
chip for a 32k-token row. Here only one [B, H, block_q, block_k] tile of scores exists at a time;
everything kept across tiles (the running max / sum / output accumulator, the gradients) is O(S).

Loop structure: a `lax.scan` over query blocks, each a `fori_loop` over the key blocks it sees;
a query block's state (m, l, acc; or dq in the backward) is the inner loop's carry and leaves the
scan finished, in q.dtype, so only one block's float32 accumulator exists at a time (a carry of
the whole row's float32 accumulators, as an earlier version had, costs 2 GiB per chip at a
64k-token row with 32 heads of 256, and XLA kept several copies). With `index_causal` the inner
loop stops at the last key block that starts before the query block ends (`block_pairs` lists
the pairs visited), so the skipped pairs cost nothing. Plain XLA, no Pallas,
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
    training step (the recipe's aot phase, t1jax/jobs/aot.py). Behind the barrier each step builds its own."""
    return lax.optimization_barrier((index, carry))


def _key_blocks(i, bq: int, bk: int, num_k_blocks: int, index_causal: bool):
    """How many key blocks query block i visits: all, or (index_causal) those starting at or
    before its last index (the key blocks block_pairs lists for it)."""
    if not index_causal:
        return num_k_blocks
    return jnp.minimum(num_k_blocks, (i * bq + bq - 1) // bk + 1)


def _unblocks(x, axis: int):
    """The inverse of _blocks for a scan's stacked outputs."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])


def _forward(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal):
    """Output [B, KV, G, S, D] in q.dtype and logsumexp [B, KV, G, S] (0 where no key is seen).
    A scan over query blocks, each a loop over its key blocks: only one query block's float32
    accumulator exists at a time, and finished blocks leave in q.dtype."""
    nq, nk = q.shape[3] // bq, k.shape[2] // bk
    stat_shape = q.shape[:3] + (bq,)

    def query_block(_, i):
        def key_block(j, carry):
            (qpos_, qseg_, kpos_, kseg_), (acc, m, l) = _in_loop((qpos, qseg, kpos, kseg), carry)
            s, mask, _, _ = _tile(q, k, qpos_, qseg_, kpos_, kseg_, i, j, bq, bk)
            vb = lax.dynamic_slice_in_dim(v, j * bk, bk, 2)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            pv = jnp.einsum("bkgqt,bktd->bkgqd", p.astype(v.dtype), vb,
                            preferred_element_type=jnp.float32)
            return acc * corr[..., None] + pv, m_new, l * corr + p.sum(-1)

        init = (jnp.zeros(stat_shape + q.shape[-1:], jnp.float32),
                jnp.full(stat_shape, NEG_INF, jnp.float32), jnp.zeros(stat_shape, jnp.float32))
        acc, m, l = lax.fori_loop(0, _key_blocks(i, bq, bk, nk, causal), key_block, init)
        seen = l > 0
        out = acc / jnp.where(seen, l, 1.0)[..., None]  # a query that sees no key: acc = 0
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
        return None, (out.astype(q.dtype), lse)

    _, (out, lse) = lax.scan(query_block, None, jnp.arange(nq))
    return _unblocks(out, 3), _unblocks(lse, 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _flash(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal):
    return _forward(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal)[0]


def _flash_fwd(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal):
    out, lse = _forward(q, k, v, qpos, qseg, kpos, kseg, bq, bk, causal)
    return out, (q, k, v, qpos, qseg, kpos, kseg, out, lse)


def _flash_bwd(bq, bk, causal, res, dout):
    """The flash-attention backward: per tile, p = exp(s - lse), dV += p^T dO, dS = p (dO V^T -
    delta) with delta = rowsum(dO * O), dQ += dS K, dK += dS^T Q (both scaled). dK / dV sum over
    the query heads of each group through the einsums' g contraction. Same loops as the
    forward: dQ is one query block's float32 accumulator at a time; dK / dV ([B, KV, T, D],
    the key/value heads only) accumulate across the scan."""
    q, k, v, qpos, qseg, kpos, kseg, out, lse = res
    scale = q.shape[-1] ** -0.5
    delta = (dout.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1)
    nq, nk = q.shape[3] // bq, k.shape[2] // bk

    def query_block(dkv, i):
        dob, lse_b, delta_b = (lax.dynamic_slice_in_dim(x, i * bq, bq, 3)
                               for x in (dout, lse, delta))

        def key_block(j, carry):
            (qpos_, qseg_, kpos_, kseg_), (dq, dk, dv) = _in_loop((qpos, qseg, kpos, kseg), carry)
            s, mask, qb, kb = _tile(q, k, qpos_, qseg_, kpos_, kseg_, i, j, bq, bk)
            vb = lax.dynamic_slice_in_dim(v, j * bk, bk, 2)
            p = jnp.where(mask, jnp.exp(s - lse_b[..., None]), 0.0)
            dp = jnp.einsum("bkgqd,bktd->bkgqt", dob, vb, preferred_element_type=jnp.float32)
            ds = p * (dp - delta_b[..., None])
            dv_b = jnp.einsum("bkgqt,bkgqd->bktd", p.astype(dout.dtype), dob,
                              preferred_element_type=jnp.float32)
            dq_b = jnp.einsum("bkgqt,bktd->bkgqd", ds.astype(k.dtype), kb,
                              preferred_element_type=jnp.float32) * scale
            dk_b = jnp.einsum("bkgqt,bkgqd->bktd", ds.astype(q.dtype), qb,
                              preferred_element_type=jnp.float32) * scale
            dk, dv = (lax.dynamic_update_slice_in_dim(
                x, lax.dynamic_slice_in_dim(x, j * bk, bk, 2) + u, j * bk, 2)
                for x, u in ((dk, dk_b), (dv, dv_b)))
            return dq + dq_b, dk, dv

        dq0 = jnp.zeros(q.shape[:3] + (bq, q.shape[-1]), jnp.float32)
        dq, dk, dv = lax.fori_loop(0, _key_blocks(i, bq, bk, nk, causal), key_block, (dq0, *dkv))
        return (dk, dv), dq.astype(q.dtype)

    zeros = tuple(jnp.zeros(x.shape, jnp.float32) for x in (k, v))
    (dk, dv), dq = lax.scan(query_block, zeros, jnp.arange(nq))
    return _unblocks(dq, 3), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


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
