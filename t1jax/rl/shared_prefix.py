"""Rows that open with the same tokens run them once: the prefix's forward runs on one row, its
keys and values are broadcast to every row as a decoding cache, and each row's own tokens attend
to them. Why: the main job's SFT rows are ~320 tokens of which the first 248 (system prompt,
tool schema) are identical in every row; running them once cuts a step's tokens ~3.5x. The loss
and its gradients are those of the full rows up to float rounding (the broadcast's gradient is
the sum over rows): tests/rl/test_shared_prefix.py checks both against the plain forward.

Only for steps that neither replay routes nor pack several samples in a row: the cache's
attention sees one sequence per row, and R3's recorded prefix routes may differ between rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from t1jax.model.cache import KVCache


def shared_prefix_length(tokens, positions, segment_ids, loss_mask, *, multiple: int = 16,
                         min_length: int = 64) -> int:
    """The longest P, a multiple of `multiple` and at least `min_length`, such that every row
    is one sequence from position 0 followed by padding, the rows agree on tokens[:P], and no
    token in [0, P] is trained (the first own token's log-prob would need the prefix's
    logits). 0 where there is none (also with an empty row: a minibatch's first row is the one
    whose prefix runs): the caller runs the plain forward."""
    tokens, positions, segment_ids, loss_mask = (np.asarray(a) for a in
                                                 (tokens, positions, segment_ids, loss_mask))
    real = segment_ids > 0
    counts = real.sum(axis=1)
    if len(counts) < 2 or not counts.all():
        return 0
    length = tokens.shape[1]
    index = np.arange(length)
    for r, n in enumerate(counts):  # one sequence, right-padded: ids constant, positions 0..n-1
        if (not real[r, :n].all() or (segment_ids[r, :n] != segment_ids[r, 0]).any()
                or (positions[r, :n] != index[:n]).any()):
            return 0
    agree = (tokens == tokens[0]).all(axis=0) & real.all(axis=0)
    untrained = ~(loss_mask != 0).any(axis=0)
    # P + 1 tokens untrained, P tokens agreeing, P below every row's length (each row keeps one)
    limit = min(int(np.argmin(agree)) if not agree.all() else length,
                int(np.argmin(untrained)) - 1 if not untrained.all() else length,
                int(counts.min()) - 1)
    prefix = max(limit, 0) // multiple * multiple
    return prefix if prefix >= min_length else 0


def suffix_length(segment_ids, prefix: int, *, multiple: int = 32) -> int:
    """Tokens each row runs after the shared prefix: its longest row's rest, rounded up to
    `multiple` (few distinct shapes, few compiles), at most the rows' own length."""
    segment_ids = np.asarray(segment_ids)
    longest = int((segment_ids > 0).sum(axis=1).max())
    return min(segment_ids.shape[1] - prefix, -(-(longest - prefix) // multiple) * multiple)


def shared_prefix_forward(model, tokens, positions, segment_ids, prefix: int, suffix: int,
                          logits: bool = True):
    """The model's output on tokens[:, prefix:prefix + suffix] of rows that share
    tokens[:, :prefix] (as shared_prefix_length checked): [B, suffix, ...]."""
    cfg = model.model.cfg
    if cfg.linear_layers:
        raise ValueError("a shared prefix needs attention in every layer: a linear-attention "
                         "state cannot be sliced into the rows' own tokens")
    rows = tokens.shape[0]
    cache = KVCache.create(cfg, 1, prefix + suffix)
    head = model(tokens[:1, :prefix], positions[:1, :prefix], segment_ids[:1, :prefix],
                 cache=cache, logits=False)
    shared = jax.tree.map(lambda a: jnp.broadcast_to(a, (rows,) + a.shape[1:]), head.cache)
    own = slice(prefix, prefix + suffix)
    return model(tokens[:, own], positions[:, own], segment_ids[:, own], cache=shared,
                 logits=logits)
