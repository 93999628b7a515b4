"""The Gated Delta Rule, the linear-attention core of Qwen3.5 / Qwen3-Next's Gated DeltaNet layers.

Per head the state S [dk, dv] evolves token by token as
    S = exp(g_t) * S
    S = S + k_t^T ((v_t - k_t S) * beta_t)
    o_t = q_t S
Two forms with one contract: `recurrent_gated_delta` scans over tokens (decode and the reference),
`chunked_gated_delta` is the parallel training form (the UT/WY transform of transformers'
torch_chunk_gated_delta_rule): a unit-lower-triangular system inside each chunk, then a scan over
chunks.

q and k are used as given: the caller L2-normalises both and scales q by dk**-0.5. H is the number
of value heads; q and k may have fewer (H a multiple), each serving H / heads value heads in turn,
as transformers' repeat_interleave. The output has v's dtype. segment_ids [B, S] (None = all
ones): 0 marks padding, which leaves the state unchanged and outputs 0; where the id changes
between consecutive non-padding tokens the state restarts from zero, so packed rows never leak state across samples. initial_state
is the state before the row's first token and belongs to its first segment; the returned state
(float32) is the one after the row's last non-padding token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _resets(segment_ids, b, s):
    """(valid, reset) [B, S]: reset is True where a token starts a new segment after an earlier
    one. Padding between two segments neither hides nor causes a reset: a token compares its id
    with the previous non-padding token's."""
    if segment_ids is None:
        segment_ids = jnp.ones((b, s), jnp.int32)
    valid = segment_ids != 0
    index = jnp.where(valid, jnp.arange(s)[None, :], -1)
    last = jax.lax.cummax(index, axis=1)
    prev = jnp.concatenate([jnp.full((b, 1), -1, last.dtype), last[:, :-1]], axis=1)
    prev_id = jnp.take_along_axis(segment_ids, jnp.maximum(prev, 0), axis=1)
    return valid, valid & (prev >= 0) & (segment_ids != prev_id)


def _neutral(valid, q, k, v, g, beta, heads: int):
    """float32 inputs with padding neutralised and q/k repeated to the value heads. Padding gets
    g = beta = 0, so it leaves the state alone, and q = 0, so its output is 0; k = v = 0 too, so
    garbage there cannot reach a result as NaN."""
    v3, v4 = valid[..., None], valid[..., None, None]
    q, k, v = (jnp.where(v4, x.astype(jnp.float32), 0.0) for x in (q, k, v))
    g, beta = (jnp.where(v3, x.astype(jnp.float32), 0.0) for x in (g, beta))
    q, k = (jnp.repeat(x, heads // x.shape[-2], axis=-2) for x in (q, k))
    return q, k, v, g, beta


def _initial(initial_state, b, h, dk, dv):
    if initial_state is None:
        return jnp.zeros((b, h, dk, dv), jnp.float32)
    return initial_state.astype(jnp.float32)


def _unit_lower_inverse(a):
    """(I + A)^-1 for A [..., C, C] strictly lower triangular (its diagonal and upper triangle are
    never read), C a power of two, by recursive 2x2 block inversion
        [[X, 0], [Y, Z]]^-1 = [[X^-1, 0], [-Z^-1 Y X^-1, Z^-1]]
    in log2(C) rounds of batched matmuls. Not jax.scipy.linalg.solve_triangular: on CPU jaxlib's
    (0.10.2) LAPACK trsm blocks an XLA pool thread while it waits for work queued to that same pool,
    so two concurrent solves (the backward pass has two) deadlock on a 2-core machine."""
    c = a.shape[-1]
    inv = jnp.ones(a.shape[:-2] + (c, 1, 1), a.dtype)  # inverses of the 1x1 diagonal blocks
    m = 1
    while m < c:
        start = 2 * m * jnp.arange(c // (2 * m))[:, None, None]
        i = jnp.arange(m)
        y = a[..., start + m + i[:, None], start + i[None, :]]  # each pair's lower-left block
        x_inv, z_inv = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        low = -z_inv @ y @ x_inv
        inv = jnp.concatenate([jnp.concatenate([x_inv, jnp.zeros_like(low)], axis=-1),
                               jnp.concatenate([low, z_inv], axis=-1)], axis=-2)
        m *= 2
    return inv[..., 0, :, :]


def recurrent_gated_delta(q, k, v, g, beta, segment_ids=None, initial_state=None):
    """-> (out [B,S,H,dv] in v's dtype, final_state [B,H,dk,dv] float32); a lax.scan over tokens
    (the decode form and the reference for the chunked one)."""
    b, s, h, _ = v.shape
    dk, dtype = q.shape[-1], v.dtype
    valid, reset = _resets(segment_ids, b, s)
    q, k, v, g, beta = _neutral(valid, q, k, v, g, beta, h)

    def step(state, x):
        q_t, k_t, v_t, g_t, b_t, reset_t = x
        state = jnp.where(reset_t[:, None, None, None], 0.0, state)
        state = state * jnp.exp(g_t)[..., None, None]
        kv = jnp.einsum("bhk,bhkv->bhv", k_t, state)
        state = state + k_t[..., :, None] * ((v_t - kv) * b_t[..., None])[..., None, :]
        out = jnp.einsum("bhk,bhkv->bhv", q_t, state)
        return state, out

    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta, reset))
    state, out = jax.lax.scan(step, _initial(initial_state, b, h, dk, v.shape[-1]), xs)
    return jnp.moveaxis(out, 0, 1).astype(dtype), state


def _chunk_terms(q, k, v, g, beta, reset):
    """The per-chunk terms of the UT transform for chunks [B, H, N, C, ...] (float32, padding
    neutral), given each chunk's reset flags [B, N, C].

    Resets so far inside the chunk: a token sees the carried-in state only if none happened before
    it (reads), tokens interact only within one segment (same), and only the chunk's last segment
    writes into the outgoing state (writes). Shared by all heads: [B, 1, N, C(, C)].
    Segment resets are masks, never -inf in g: a cumulative sum of log decays that contains a huge
    negative value loses all float32 precision for the tokens after it."""
    c = q.shape[-2]
    resets = jnp.cumsum(reset.astype(jnp.int32), axis=-1)[:, None]
    reads = resets == 0
    writes = resets == resets[..., -1:]
    causal = jnp.tril(jnp.ones((c, c), bool))
    same = (resets[..., :, None] == resets[..., None, :]) & causal

    cum = jnp.cumsum(g, axis=-1)  # log decay from the chunk start through each token
    # decay[i, j] = exp(cum_i - cum_j): the decay between tokens j <= i; masked before the exp so
    # the (positive) upper triangle can neither overflow nor send NaNs into the gradient.
    decay = jnp.exp(jnp.where(same, cum[..., :, None] - cum[..., None, :], -jnp.inf))

    # UT transform: (I + A) u = beta v - beta exp(cum) k S0 with A strictly lower triangular, so
    # u = new_values - k_cumdecay @ S0, where S0 is the state carried into the chunk.
    a = beta[..., :, None] * jnp.einsum("...id,...jd->...ij", k, k) * decay
    t_inv = _unit_lower_inverse(a)
    read_decay = jnp.where(reads, jnp.exp(cum), 0.0)
    new_values = t_inv @ (beta[..., None] * v)
    k_cumdecay = t_inv @ ((beta * read_decay)[..., None] * k)

    attn = jnp.einsum("...id,...jd->...ij", q, k) * decay
    q_read = q * read_decay[..., None]
    k_write = k * jnp.where(writes, jnp.exp(cum[..., -1:] - cum), 0.0)[..., None]
    carry = jnp.where(reads[..., -1], jnp.exp(cum[..., -1]), 0.0)  # [B, H, N]
    return new_values, k_cumdecay, attn, q_read, k_write, carry


def _chunk_step(state, x):
    """One chunk: its output from the carried-in state and the chunk's own tokens, and the state
    it passes on."""
    new_values, k_cumdecay, attn, q_read, k_write, carry = x
    u = new_values - k_cumdecay @ state
    out = q_read @ state + attn @ u
    state = carry[..., None, None] * state + jnp.swapaxes(k_write, -1, -2) @ u
    return state, out


def default_group(chunks: int) -> int:
    """The largest power of two whose square is at most `chunks`: about sqrt(N) groups of
    sqrt(N) chunks, which minimises the states the backward pass keeps (one per group, plus one
    group's while it recomputes)."""
    group = 1
    while (2 * group) ** 2 <= chunks:
        group *= 2
    return group


def chunked_gated_delta(q, k, v, g, beta, segment_ids=None, initial_state=None, chunk_size=64,
                        group=None):
    """-> (out [B,S,H,dv] in v's dtype, final_state [B,H,dk,dv] float32); same result as
    recurrent_gated_delta, computed with matmuls inside chunks of chunk_size tokens and a scan
    over chunks. q and k may have fewer heads than v (each then serves H / heads value heads).

    Memory: chunks go in groups of `group` (default: about sqrt of the chunk count) under
    jax.checkpoint, and only a group's float32 terms exist at a time. The backward pass keeps the
    state at each group boundary and recomputes a group's terms and states, instead of holding
    every chunk's [C, C] and [C, d] terms and [dk, dv] state: at a 64k-token row with 64 heads
    of 128 that is 4 GiB of states and ~10 GiB of terms per layer, against ~0.3 GiB."""
    b, s, h, dv = v.shape
    dk, dtype = q.shape[-1], v.dtype
    c = chunk_size
    assert c > 0 and c & (c - 1) == 0, f"chunk_size must be a power of two, got {c}"
    valid, reset = _resets(segment_ids, b, s)
    n = -(-s // c)
    group = group or default_group(n)
    groups = -(-n // group)
    pad = groups * group * c - s  # padded tokens are padding (valid False): they change nothing

    def grouped(x):
        """[B, S, ...] -> [groups, B, group, C, ...], zero padded."""
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(b, groups, group, c, *x.shape[2:]), 1, 0)

    def one_group(state, xs):
        # the barrier keeps the float32 casts below inside the loop: without it XLA's TPU
        # compiler hoists them and casts the whole row at once (f32 copies of v, 2 GiB per chip
        # at a 64k-token row, several alive), as it hoisted flash attention's masks
        state, xs = jax.lax.optimization_barrier((state, xs))
        q, k, v, g, beta, valid, reset = xs
        q, k, v, g, beta = _neutral(valid, q, k, v, g, beta, h)
        # heads before chunks: [B, H, group, C, d] and [B, H, group, C]
        q, k, v = (jnp.moveaxis(x, 3, 1) for x in (q, k, v))
        g, beta = (jnp.moveaxis(x, 3, 1) for x in (g, beta))
        terms = _chunk_terms(q, k, v, g, beta, reset)
        state, out = jax.lax.scan(_chunk_step, state, tuple(jnp.moveaxis(x, 2, 0) for x in terms))
        # [group, B, H, C, dv] -> [B, group * C, H, dv], in v's dtype: the stacked outputs
        # (and their cotangents) are a whole row's worth
        out = jnp.transpose(out, (1, 0, 3, 2, 4)).reshape(b, group * c, h, dv)
        # and the output's cast stays in too (else a float32 row of outputs, and in the
        # backward of their cotangents, [groups, B, group * C, H, dv])
        return jax.lax.optimization_barrier((state, out.astype(dtype)))

    xs = tuple(grouped(x) for x in (q, k, v, g, beta, valid, reset))
    state, out = jax.lax.scan(jax.checkpoint(one_group), _initial(initial_state, b, h, dk, dv), xs)
    out = jnp.moveaxis(out, 0, 1).reshape(b, groups * group * c, h, dv)[:, :s]
    return out, state
