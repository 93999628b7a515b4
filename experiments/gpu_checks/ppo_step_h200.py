"""GPU check: one full PPO step (Trainer.ppo_step, R3 on) of a Qwen3-MoE sized to fill one H200.

Run on the GPU host from the repository root (needs jax with its CUDA backend,
`pip install -U "jax[cuda12]"`, and t1jax itself, `pip install --no-deps -e .`):

  python experiments/gpu_checks/ppo_step_h200.py [--steps 3] [--samples 8] [--length 512]
      [--layers 24] [--experts 32] [--moe-intermediate 768] [--max-seconds 240]
  python experiments/gpu_checks/ppo_step_h200.py --small   # same code path, tiny config, any CPU

Without a GPU backend it prints "SKIP: no GPU (backend cpu)" (plus the install hint) and exits 0.

Model (default): Qwen3-30B-A3B's layer shapes at fewer layers/experts: vocab 151936, hidden 2048,
24 layers, 32 query / 4 KV heads x 128, 32 experts top-8, expert FFN 768, untied LM head:
4.70B total / 1.98B active parameters per model (actor; the critic is the same backbone with a
value head, 4.39B). param_dtype = compute_dtype = bfloat16. The Adam moments follow the
parameters' dtype (optax.adam with mu_dtype=None), so they are bfloat16 too: the trainer's
optimizer is used as is, nothing is changed for this check.

Memory estimate (printed, rough, bytes):
  persistent  actor + critic: params 2 + Adam mu 2 + nu 2       = 6 * (P_actor + P_critic)
  transient   one model's update at a time: grads 2 + updates 2 = 4 * P_actor
  activations one model's forward kept for its backward, per token and layer: attention scores
              and probs in float32 (2 * heads * S * 4), ~16 hidden-size bf16 tensors, q/k/v/o
              (+ float32 RoPE copies), the k routed copies of x and their gate/up/act (k *
              (d + 3F) * 2), router logits (E * 4); plus the LM head's logits, ~10 bytes per
              token and vocab entry (bf16 logits, float32 upcast, softmax/grad)
Default batch 8 x 512 tokens: estimate ~102 GiB of ~139 GiB (73%). JAX is told it may use 92%
of the GPU memory (XLA_PYTHON_CLIENT_MEM_FRACTION, unless already set); the default 75% would
leave too little margin.

It measures a bfloat16 8192 x 8192 jnp.dot peak itself, builds the Trainer, runs one warm-up
(compile) step and up to --steps timed steps (stopping early past --max-seconds), and prints
tokens/s, the analytic model FLOPs per step (experiments/benchmarks/ppo_step.py: per token
forward = 2 * N_matmul + 4 * L * S * d_attn; a PPO step = 4 x (actor + critic) forwards), MFU
against the measured peak, device.memory_stats() and the elapsed time (target: under 5 min).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

INSTALL_HINT = ('install the CUDA backend of jax on the GPU host: pip install -U "jax[cuda12]" '
                '(or "jax[cuda13]" for a CUDA 13 driver), then re-run')


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true",
                   help="tiny config (configs/model/tiny.py) on whatever backend: a CPU smoke run")
    p.add_argument("--steps", type=int, default=3, help="timed steps at most")
    p.add_argument("--samples", type=int, default=None, help="default 8 (--small: 4)")
    p.add_argument("--length", type=int, default=None, help="default 512 (--small: 128)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--moe-intermediate", type=int, default=768)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--peak-n", type=int, default=None, help="matmul size (default 8192; --small 1024)")
    p.add_argument("--max-seconds", type=float, default=240.0,
                   help="stop timed steps once the whole run has taken this long")
    p.add_argument("--hbm-gib", type=float, default=139.0, help="for the estimate's percentage")
    return p.parse_args()


def nvidia_smi() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() \
        else None


def model_config(args):
    from t1jax.jobs.config_file import load_config_file
    from t1jax.model.config import ModelConfig, model_config_from
    if args.small:
        cfg = model_config_from(load_config_file(str(ROOT / "configs/model/tiny.py")).model)
        return cfg.replace(param_dtype=args.dtype, compute_dtype=args.dtype)
    return ModelConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        moe_intermediate_size=args.moe_intermediate, num_hidden_layers=args.layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=args.experts,
        num_experts_per_tok=args.top_k, norm_topk_prob=True, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, max_position_embeddings=40960, tie_word_embeddings=False,
        param_dtype=args.dtype, compute_dtype=args.dtype, moe_dispatch="auto")


def fmt(x: float, unit: str, base: float = 1000.0) -> str:
    """x in the largest of k/M/G/T (base 1000) or Ki/Mi/Gi (base 1024) that keeps it >= 1."""
    prefixes = ("", "K", "M", "G", "T") if base == 1000.0 else ("", "Ki", "Mi", "Gi", "Ti")
    i = 0
    while i < len(prefixes) - 1 and abs(x) >= base:
        x, i = x / base, i + 1
    return f"{x:.2f} {prefixes[i]}{unit}"


def memory_estimate(cfg, rows: int, seq: int) -> dict[str, float]:
    """Bytes, by part (see the module docstring)."""
    from t1jax.model.sizes import param_counts
    pc = param_counts(cfg)
    p_actor = pc["total"]
    p_critic = p_actor - pc["lm_head"] + cfg.hidden_size
    b = 2 if cfg.param_dtype in ("bfloat16", "float16") else 4
    cb = 2 if cfg.compute_dtype in ("bfloat16", "float16") else 4
    d, h, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    k, f, e = cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.num_experts
    per_tok_layer = (2 * h * seq * 4 + 16 * d * cb + (2 * h * hd + 2 * kv * hd) * cb
                     + (h * hd + kv * hd) * 4 + k * (d + 3 * f) * cb + e * 4)
    tokens = rows * seq
    est = {"params+adam (actor+critic)": 3 * b * (p_actor + p_critic),
           "grads+updates (one model)": 2 * b * p_actor,
           "activations (one model, layers)": tokens * cfg.num_hidden_layers * per_tok_layer,
           "activations (LM head logits)": tokens * cfg.vocab_size * (cb + 8)}
    est["total"] = sum(est.values())
    return est


def main() -> int:
    args = parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    t_start = time.perf_counter()
    import jax
    import jax.numpy as jnp
    import numpy as np

    backend = jax.default_backend()
    if not args.small and backend != "gpu":
        gpu = nvidia_smi()
        print(f"SKIP: no GPU (backend {backend})"
              + (f"; nvidia-smi sees '{gpu}' but jax has no GPU backend" if gpu else ""))
        print(f"hint: {INSTALL_HINT}")
        return 0

    from experiments.benchmarks import ppo_step as bench
    from t1jax import sharding
    from t1jax.model.sizes import param_counts
    from t1jax.rl.trainer import Trainer

    samples_n = args.samples or (4 if args.small else 8)
    length = args.length or (128 if args.small else 512)
    peak_n = args.peak_n or (1024 if args.small else 8192)
    for line in bench.machine_lines():
        print(line)
    if backend == "gpu":
        print(f"nvidia-smi: {nvidia_smi()}")
    cfg = model_config(args)
    pc = param_counts(cfg)
    print(f"config: {'tiny (--small)' if args.small else 'H200 check'} | params total "
          f"{pc['total']:,} active {pc['active']:,} | L={cfg.num_hidden_layers} "
          f"d={cfg.hidden_size} heads={cfg.num_attention_heads}/{cfg.num_key_value_heads}x"
          f"{cfg.head_dim} E={cfg.num_experts} k={cfg.num_experts_per_tok} "
          f"F={cfg.moe_intermediate_size} V={cfg.vocab_size} | {cfg.param_dtype}/"
          f"{cfg.compute_dtype}, Adam moments {cfg.param_dtype} | dispatch="
          f"{bench.dispatch_name(cfg.moe_dispatch)}")

    dev = jax.devices()[0]
    est = memory_estimate(cfg, samples_n, length)
    limit = None
    try:
        limit = (dev.memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001 (CPU devices may not implement it)
        pass
    hbm = limit if limit else args.hbm_gib * 2 ** 30
    print(f"memory estimate for {samples_n} x {length} tokens: " + ", ".join(
        f"{k} {fmt(v, 'B', 1024.0)}" for k, v in est.items())
        + f" = {est['total'] / hbm:.1%} of {hbm / 2 ** 30:.1f} GiB"
        + (" (JAX's limit)" if limit else " (--hbm-gib)"))

    dtype = jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else jnp.float32
    peak = bench.matmul_peak(peak_n, dtype, repeats=10 if backend == "gpu" else 5)
    print(f"matmul peak: {jnp.dtype(dtype).name} {peak_n}x{peak_n} jnp.dot "
          f"{fmt(peak, 'FLOP/s')} | elapsed {time.perf_counter() - t_start:.0f}s")

    mesh = sharding.make_mesh(devices=[dev])
    t = time.perf_counter()
    trainer = Trainer(cfg, bench.rl_settings(length, r3=True), mesh)
    jax.block_until_ready(trainer.state)
    print(f"Trainer built in {time.perf_counter() - t:.1f}s | elapsed "
          f"{time.perf_counter() - t_start:.0f}s")
    samples = bench.synthetic_samples(cfg, samples_n, length)
    batch, _ = trainer.make_batch(samples)
    rows, seq = batch.tokens.shape
    real = int(np.sum(np.asarray(batch.segment_ids) > 0))
    print(f"batch: {rows} rows x {seq} ({real} real tokens, "
          f"{int(np.sum(np.asarray(batch.loss_mask)))} sampled)")

    left = args.max_seconds - (time.perf_counter() - t_start)
    res = bench.run_variants({"r3=on": trainer}, batch, args.steps,
                             max_seconds=max(left, 0.0))["r3=on"]
    flops = bench.ppo_step_flops(cfg, trainer.s, rows, seq)
    sec = res["median_s"]
    f = bench.forward_flops_per_token(cfg, seq)
    print(f"model FLOPs per PPO step: {fmt(flops, 'FLOP')} (forward/token: actor "
          f"{fmt(f['actor'], 'FLOP')}, critic {fmt(f['critic'], 'FLOP')}; "
          f"{1 + 3 * trainer.s.epochs}x each)")
    print(f"PPO step: compile+first {res['compile_s']:.1f}s | median {sec:.3f}s over "
          f"{len(res['times'])} steps (min {min(res['times']):.3f}s) | {real / sec:,.0f} tokens/s "
          f"| {fmt(flops / sec, 'FLOP/s')} | MFU {flops / sec / peak:.1%} of the measured "
          f"{jnp.dtype(dtype).name} matmul peak")
    m = res["metrics"]
    print(f"last metrics: critic/value_loss {m.get('critic/value_loss', float('nan')):.4f} "
          f"actor/approx_kl {m.get('actor/approx_kl', float('nan')):.2e} "
          f"perf/step_seconds {m['perf/step_seconds']:.3f}")
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001
        stats = {}
    if stats:
        g = lambda k: stats.get(k, 0) / 2 ** 30  # noqa: E731
        print(f"memory: in use {g('bytes_in_use'):.1f} GiB, peak {g('peak_bytes_in_use'):.1f} "
              f"GiB, limit {g('bytes_limit'):.1f} GiB (estimate {est['total'] / 2 ** 30:.1f} GiB)")
    else:
        print("memory: device.memory_stats() not available on this backend")
    elapsed = time.perf_counter() - t_start
    print(f"elapsed {elapsed:.0f}s ({'within' if elapsed <= 300 else 'OVER'} 5 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
