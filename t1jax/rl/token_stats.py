"""Per-token statistics of the LM head's distribution, computed in sequence chunks.

The trainer needs log p(sampled token), and optionally the entropy and the argmax accuracy, at
every position. Materialising the float32 logits [B, L, vocab] first costs B * L * V * 4 bytes
(20-63 GB per chip at 32k-64k tokens and 152k-248k vocab), and autodiff keeps them (or the
softmax) alive for the backward pass. Here a `lax.scan` over sequence chunks builds one
[B, chunk, V] block at a time, and `jax.checkpoint` on the per-chunk body makes the backward pass
recompute that block, so the only per-chunk residuals are the hidden chunk and its targets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_stats(hidden, head, tokens, temperature: float = 1.0, *, chunk: int = 1024,
                entropy: bool = False, accuracy: bool = False) -> dict[str, jax.Array]:
    """hidden [B, L, D] (the backbone's normed output, any float dtype), head [D, V] (the LM
    head, cast to hidden.dtype as CausalLM does), tokens int32 [B, L].
    Returns float32 [B, L] arrays aligned like trainer.token_logprobs: "logp"[t] = log p(tokens[t])
    under softmax(logits[t-1] / temperature), 0 at t=0; with entropy=True also "entropy"[t] = the
    entropy of that distribution (0 at t=0); with accuracy=True "correct"[t] = 1.0 where
    argmax(logits[t-1]) == tokens[t] (0 at t=0), no gradient."""
    B, L, D = hidden.shape
    head = head.astype(hidden.dtype)
    names = ["logp"] + ["entropy"] * entropy + ["correct"] * accuracy
    n = L - 1                                   # positions 0..L-2 predict tokens 1..L-1
    if n <= 0:
        return {k: jnp.zeros((B, L), jnp.float32) for k in names}
    chunk = max(1, min(chunk, n))
    k = -(-n // chunk)
    pad = k * chunk - n
    h = jnp.pad(hidden[:, :-1], ((0, 0), (0, pad), (0, 0)))
    tgt = jnp.pad(tokens[:, 1:].astype(jnp.int32), ((0, 0), (0, pad)))
    h = h.reshape(B, k, chunk, D).swapaxes(0, 1)             # [k, B, chunk, D]
    tgt = tgt.reshape(B, k, chunk).swapaxes(0, 1)            # [k, B, chunk]

    @jax.checkpoint
    @jax.named_scope("lm_head")
    def stats(head, h_c, t_c):
        logits = jnp.einsum("bsd,dv->bsv", h_c, head, preferred_element_type=jnp.float32)
        scaled = logits / temperature
        logz = jax.nn.logsumexp(scaled, axis=-1)
        out = {"logp": jnp.take_along_axis(scaled, t_c[..., None], axis=-1)[..., 0] - logz}
        if entropy:  # as ppo.entropy: -sum p log p (logz - E[scaled] cancels when H is small)
            logp = scaled - logz[..., None]
            out["entropy"] = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
        if accuracy:
            hit = jnp.argmax(logits, axis=-1) == t_c
            out["correct"] = jax.lax.stop_gradient(hit.astype(jnp.float32))
        return out

    _, ys = jax.lax.scan(lambda c, x: (c, stats(head, *x)), None, (h, tgt))

    def unchunk(y):                                          # [k, B, chunk] -> [B, L]
        y = y.swapaxes(0, 1).reshape(B, k * chunk)[:, :n]
        return jnp.pad(y, ((0, 0), (1, 0)))
    return {name: unchunk(ys[name]) for name in names}
