"""MoE expert dispatch: forward+backward tokens/s of each t1jax.model.dispatch strategy vs a dense
SwiGLU FFN of equal active FLOPs (F_dense = k*F), measured in the same run. Picks AUTO["cpu"].

  .venv/bin/python experiments/benchmarks/moe_dispatch.py [--tokens 2048] [--repeats 5]
      [--strategies ragged,padded,dense,blocked] [--experts 64,128] [--k 8] [--d 256] [--f 128]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from t1jax.model.dispatch import STRATEGIES, expert_ffn  # noqa: E402


def median_seconds(fn, args, repeats: int) -> float:
    """Median wall time of fn(*args) after one excluded warm-up (compile) call."""
    return interleaved_medians([(fn, args)], repeats)[0]


def interleaved_medians(cases, repeats: int) -> list[float]:
    """Median wall time of each (fn, args), warm-up excluded, repeats interleaved across cases
    so that load drifting on a shared machine hits every case alike."""
    for fn, args in cases:
        jax.block_until_ready(fn(*args))
    times = [[] for _ in cases]
    for _ in range(repeats):
        for (fn, args), out in zip(cases, times):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            out.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    return 2 * n ** 3 / median_seconds(jax.jit(jnp.matmul), (a, b), repeats) / 1e9


def moe_inputs(t: int, d: int, f: int, e: int, k: int, dtype):
    keys = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(keys[0], (t, d), dtype)
    logits = jax.random.normal(keys[1], (t, e), jnp.float32)
    top_w, top_i = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)  # distinct experts per token
    s = 0.02
    wg = (s * jax.random.normal(keys[2], (e, d, f))).astype(dtype)
    wu = (s * jax.random.normal(keys[3], (e, d, f))).astype(dtype)
    wd = (s * jax.random.normal(keys[4], (e, f, d))).astype(dtype)
    return x, top_i.astype(jnp.int32), top_w, wg, wu, wd


def moe_step(strategy: str):
    def loss(x, w, wg, wu, wd, idx):
        y = expert_ffn(x, idx, w, wg, wu, wd, strategy=strategy)
        return jnp.mean(jnp.square(y.astype(jnp.float32)))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
    return lambda x, idx, w, wg, wu, wd: grad(x, w, wg, wu, wd, idx)


def dense_step():
    def loss(x, w1, w3, w2):
        h = jax.nn.silu(x @ w1) * (x @ w3)
        return jnp.mean(jnp.square((h @ w2).astype(jnp.float32)))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--experts", default="64,128")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--f", type=int, default=128, help="per-expert intermediate size")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    dtype = jnp.dtype(args.dtype)
    t, d, f, k = args.tokens, args.d, args.f, args.k

    print(f"machine: {platform.platform()} | {platform.processor() or platform.machine()} | "
          f"cpus={os.cpu_count()} | jax {jax.__version__} | backend={jax.default_backend()} "
          f"| devices={jax.device_count()}")
    print(f"float32 2048x2048 matmul: {matmul_peak_gflops():.1f} GFLOP/s")
    print(f"sizes: T={t} D={d} F={f} k={k} dtype={args.dtype} | fwd+bwd w.r.t. x, gate weights, "
          f"expert params | median of {args.repeats}")
    # Active (useful) FLOPs of fwd+bwd: 3 matmuls of 2*T*k*D*F each, times 3 for backward.
    active_gflop = 3 * 3 * 2 * t * k * d * f / 1e9

    keys = jax.random.split(jax.random.key(1), 4)
    xd = jax.random.normal(keys[0], (t, d), dtype)
    w1 = (0.02 * jax.random.normal(keys[1], (d, k * f))).astype(dtype)
    w3 = (0.02 * jax.random.normal(keys[2], (d, k * f))).astype(dtype)
    w2 = (0.02 * jax.random.normal(keys[3], (k * f, d))).astype(dtype)
    baseline = dense_step()

    header = (f"{'E':>4} {'k':>2} {'strategy':<16} {'ms/step':>9} {'tokens/s':>10} {'act GFLOP/s':>11} "
              f"{'vs dense FFN':>12}")
    print(header)
    print("-" * len(header))
    for e in (int(v) for v in args.experts.split(",")):
        inputs = moe_inputs(t, d, f, e, k, dtype)
        names = args.strategies.split(",")
        # Baseline timed in the same interleaved loop as this E's strategies.
        secs = interleaved_medians([(baseline, (xd, w1, w3, w2))] + [(moe_step(n), inputs) for n in names],
                                   args.repeats)
        for name, sec in zip([f"dense-FFN(F={k * f})"] + names, secs):
            print(f"{e:>4} {k:>2} {name:<16} {sec * 1e3:9.1f} {t / sec:10.0f} "
                  f"{active_gflop / sec:11.1f} {secs[0] / sec:12.3f}", flush=True)

if __name__ == "__main__":
    main()
