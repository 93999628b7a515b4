"""Embedded JaxEngine at growing context lengths: KV-cache memory, process memory, time to first
token (a full prefill) and decode tokens/s (--new tokens over a context that is already full but
for them: a session continuation whose prefill the engine reuses), one sequence.

Why: context management (t1jax/rollout/context.py) chooses a per-chunk budget; this shows what a
budget costs in the engine. The cache is allocated for max_len positions, so its bytes grow
linearly with the budget, and each decoded token attends over the whole prompt. Ratios are
against the shortest length, measured in the same run. Peak RSS is the process's high-water
mark (it only grows, so lengths run shortest first).

  .venv/bin/python experiments/benchmarks/context_lengths.py \
      [--lengths 1024,8192,32768] [--new 32] [--repeats 2] [--config configs/model/tiny.py]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time


import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.cache import KVCache  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.model.hf_io import num_params  # noqa: E402
from t1jax.model.transformer import CausalLM  # noqa: E402
from t1jax.rollout.engine import SamplingParams  # noqa: E402
from t1jax.rollout.jax_engine import JaxEngine  # noqa: E402


def cache_bytes(cfg, length: int) -> int:
    """Bytes of the KV cache the engine allocates for one row of `length` positions."""
    shapes = jax.eval_shape(lambda: KVCache.create(cfg, 1, length))
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/model/tiny.py")
    parser.add_argument("--lengths", default="1024,8192,32768")
    parser.add_argument("--new", type=int, default=32, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    lengths = sorted(int(x) for x in args.lengths.split(","))

    model_config = load_config_file(args.config).model
    model_config.max_position_embeddings = max(model_config.max_position_embeddings, lengths[-1])
    cfg = model_config_from(model_config)
    model = CausalLM(cfg, nnx.Rngs(0))
    load = os.getloadavg()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; python {platform.python_version()}, jax "
          f"{jax.__version__} ({jax.default_backend()})")
    print(f"model: {args.config}, {num_params(model) / 1e6:.2f}M parameters, "
          f"{cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} kv heads x {cfg.head_dim}, "
          f"{cfg.compute_dtype}, attention {cfg.attention}; one sequence, prompt = length - "
          f"{args.new}, {args.new} new tokens, greedy, median of {args.repeats}", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for length in lengths:
        prompt = rng.integers(1, cfg.vocab_size, size=length - args.new - 1).tolist()
        engine = JaxEngine(model, max_batch=1, max_len=length,
                           prefill_buckets=(32, len(prompt) + 1))

        def first_token(session=None, engine=engine, prompt=prompt):
            return engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=1),
                                   session_ids=[session])[0]

        def decode(first, engine=engine, prompt=prompt):
            """Continue the session: its row holds the prompt's keys, so this call prefills one
            token and decodes --new over the full context (no stop ids: exactly --new)."""
            return engine.generate([prompt + first.output_ids],
                                   SamplingParams(temperature=0.0, max_new_tokens=args.new),
                                   session_ids=["s"])[0]

        t0 = time.perf_counter()
        decode(first_token("s"))  # compiles prefill (both buckets) and decode
        compile_s = time.perf_counter() - t0
        ttfts, decodes = [], []
        for _ in range(args.repeats):
            engine.drop_sessions()
            t = time.perf_counter()
            first = first_token()  # no session: a full prefill
            ttfts.append(time.perf_counter() - t)
            engine.drop_sessions()
            first = first_token("s")
            t = time.perf_counter()
            out = decode(first)
            decodes.append(len(out.output_ids) / (time.perf_counter() - t))
        assert engine.stats["reused_tokens"] > 0, "the decode calls did not reuse the prefill"
        kv = cache_bytes(cfg, length)
        ttft, tok_s = statistics.median(ttfts), statistics.median(decodes)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
        rows.append((length, kv, rss, ttft, tok_s, len(prompt) / ttft, compile_s))
        print(f"length {length}: kv cache {kv / 2**20:.1f} MiB, peak RSS {rss:.2f} GiB, TTFT "
              f"{ttft:.3f} s ({len(prompt) / ttft:.0f} prompt tok/s), decode {tok_s:.1f} tok/s, "
              f"first calls (compile) {compile_s:.1f} s", flush=True)
        del engine

    base = rows[0]
    print()
    print("| context | KV cache (MiB) | peak RSS (GiB) | TTFT (s) | prefill tok/s | decode tok/s "
          "| KV vs shortest | TTFT vs shortest | decode vs shortest |")
    print("|---|---|---|---|---|---|---|---|---|")
    for length, kv, rss, ttft, decode, prefill, _ in rows:
        print(f"| {length} | {kv / 2**20:.1f} | {rss:.2f} | {ttft:.3f} | {prefill:.0f} | "
              f"{decode:.1f} | {kv / base[1]:.1f}x | {ttft / base[3]:.1f}x | "
              f"{decode / base[4]:.2f}x |")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
