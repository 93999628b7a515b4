"""A step's batch cut into minibatches, and the updates of one model scanned over them.

Why the cut is strided: rows sit in contiguous blocks per device, so minibatch i takes rows i,
i + n, i + 2n, ... and keeps rows on every device. The same cut serves the pre-update forwards
(`per_minibatch`, one minibatch's activations at a time) and the optimizer updates
(`train_minibatches`, epochs x minibatches updates in one lax.scan).

Separate from trainer.py: it knows nothing of PPO, the critic or the settings, only a loss, an
optax transformation and arrays with a leading row axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def _split(x, n: int):
    """[B, ...] -> [n, B / n, ...], minibatch i = rows i, i + n, i + 2n, ...: rows are placed in
    contiguous blocks per device, so every minibatch keeps rows on every device (a contiguous
    split would put each minibatch on 1/n of the devices)."""
    return x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1)


def _unsplit(x):
    return x.swapaxes(0, 1).reshape((-1,) + x.shape[2:])


def _minibatches(tree, n: int, epochs: int):
    """[B, ...] leaves -> [epochs * n, B / n, ...] (same order each epoch)."""
    def split(x):
        x = _split(x, n)
        return jnp.concatenate([x] * epochs, axis=0) if epochs > 1 else x
    return jax.tree.map(split, tree)


def per_minibatch(fn, params, tree, n: int):
    """fn(params, minibatch) over the batch one minibatch at a time, results reassembled to
    [B, ...]: the pre-update forwards then hold one minibatch's activations, as the updates
    do. (params ride in the scan's carry: nnx state must not be closed over across traces.)"""
    if n == 1:
        return fn(params, tree)
    _, out = jax.lax.scan(lambda p, b: (p, fn(p, b)), params,
                          jax.tree.map(lambda x: _split(x, n), tree))
    return jax.tree.map(_unsplit, out)


AFTER_FIRST = ("actor/clip_frac", "actor/approx_kl")  # also averaged over updates 2..n


def train_minibatches(loss_fn, params, opt_state, tx, data, minibatches: int, epochs: int):
    """Minibatch updates of one model (lax.scan); returns params, opt state, mean metrics."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def update(carry, mb):
        params, opt_state = carry
        (_, aux), grads = grad_fn(params, *mb)
        updates, opt_state = tx.update(grads, opt_state, params)
        aux = dict(aux, grad_norm=optax.tree.norm(grads))
        return (optax.apply_updates(params, updates), opt_state), aux

    (params, opt_state), aux = jax.lax.scan(update, (params, opt_state),
                                            _minibatches(data, minibatches, epochs))
    means = jax.tree.map(jnp.mean, aux)
    if minibatches * epochs > 1:  # the first update's ratio is 1 by construction
        means.update({f"{k}_after_first": jnp.mean(aux[k][1:]) for k in AFTER_FIRST
                      if k in aux})
    return params, opt_state, means
