"""Gated Delta Rule: forward+backward tokens/s of the chunked form (t1jax.model.gated_delta's
chunked_gated_delta, chunks in checkpointed groups of about sqrt(N)) vs the token scan
(recurrent_gated_delta) per sequence length, measured in the same run, with the two forms' max abs
difference on the run's inputs; and the compiled backward pass's temporaries (XLA's memory
analysis) of the grouped form against all chunks in one group (every chunk's terms and states
alive at once, as the form was before grouping).

  .venv/bin/python experiments/benchmarks/gated_delta.py [--lengths 1024,4096,16384]
      [--batch 1] [--heads 4] [--dk 64] [--dv 64] [--chunk 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments.benchmarks.moe_dispatch import interleaved_medians  # noqa: E402
from t1jax.model.gated_delta import chunked_gated_delta, recurrent_gated_delta  # noqa: E402


def inputs(b: int, s: int, h: int, dk: int, dv: int):
    """As a Gated DeltaNet layer feeds the rule: L2-normalised q/k, q scaled by dk**-0.5,
    log decays <= 0, beta in (0, 1)."""
    ks = jax.random.split(jax.random.key(0), 5)

    def l2norm(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    q = l2norm(jax.random.normal(ks[0], (b, s, h, dk))) * dk ** -0.5
    k = l2norm(jax.random.normal(ks[1], (b, s, h, dk)))
    v = jax.random.normal(ks[2], (b, s, h, dv))
    g = -jax.nn.softplus(jax.random.normal(ks[3], (b, s, h)))
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, s, h)))
    return q, k, v, g, beta


def fwd_bwd(fn):
    """Jitted gradient of sum(outputs) w.r.t. q, k, v, g, beta."""
    def loss(q, k, v, g, beta):
        return jnp.sum(fn(q, k, v, g, beta)[0])
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))


def temp_mb(fn, xs) -> float:
    """Temporaries of the compiled forward+backward pass, MB."""
    return fwd_bwd(fn).lower(*xs).compile().memory_analysis().temp_size_in_bytes / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dk", type=int, default=64)
    parser.add_argument("--dv", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    b, h, dk, dv = args.batch, args.heads, args.dk, args.dv
    chunked = functools.partial(chunked_gated_delta, chunk_size=args.chunk)

    print(f"machine: {platform.platform()} | {platform.processor() or platform.machine()} | "
          f"cpus={os.cpu_count()} | jax {jax.__version__} | backend={jax.default_backend()} "
          f"| devices={jax.device_count()}")
    print(f"shape: B={b} H={h} dk={dk} dv={dv} chunk={args.chunk} float32 | fwd+bwd w.r.t. q, k, v, "
          f"g, beta | median of {args.repeats} | chunked/recurrent = ratio of tokens/s")
    header = (f"{'S':>6} {'chunked ms':>11} {'chunked tok/s':>14} {'recurrent ms':>13} "
              f"{'recurrent tok/s':>16} {'chunked/recurrent':>18} {'max|out diff|':>14} "
              f"{'max|state diff|':>16} {'temps MB':>9} {'1-group MB':>11} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for s in (int(x) for x in args.lengths.split(",")):
        xs = inputs(b, s, h, dk, dv)
        out_c, fin_c = jax.jit(chunked)(*xs)
        out_r, fin_r = jax.jit(recurrent_gated_delta)(*xs)
        out_diff = float(jnp.max(jnp.abs(out_c - out_r)))
        state_diff = float(jnp.max(jnp.abs(fin_c - fin_r)))
        sec_c, sec_r = interleaved_medians([(fwd_bwd(chunked), xs), (fwd_bwd(recurrent_gated_delta), xs)],
                                           args.repeats)
        tokens = b * s
        one_group = functools.partial(chunked, group=-(-s // args.chunk))
        grouped_mb, one_mb = temp_mb(chunked, xs), temp_mb(one_group, xs)
        print(f"{s:>6} {sec_c * 1e3:11.1f} {tokens / sec_c:14.0f} {sec_r * 1e3:13.1f} "
              f"{tokens / sec_r:16.0f} {sec_r / sec_c:18.2f} {out_diff:14.2e} {state_diff:16.2e} "
              f"{grouped_mb:9.1f} {one_mb:11.1f} {one_mb / grouped_mb:6.1f}", flush=True)


if __name__ == "__main__":
    main()
