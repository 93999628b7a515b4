"""One full PPO step of the Trainer (t1jax.rl.trainer): tokens/s, model FLOPs, MFU and the cost of R3.

The step is `Trainer.ppo_step` as training runs it: critic forward (old values) + actor forward
with replay (old log-probs, mismatch metrics) + GAE + critic update (forward+backward, Adam) +
actor update (forward+backward, Adam), one jitted call that donates the state. The batch is
synthetic: --samples trials of --length tokens, each a few "assistant turns" (loss mask on ~half
the tokens), random rollout log-probs on the sampled tokens, a route (distinct top-k experts)
recorded for every token and MoE layer (-1 on dense layers), a 0/1 reward. Packed once by the
trainer (one sample per row when --length is a bucket), reused for every step.

Timing: one warm-up (compile) step per variant excluded; then --steps timed steps per variant,
rl.r3=False and rl.r3=True alternating (two Trainers with the same seed), median reported. A
step's time runs from the call to jax.block_until_ready(trainer.state).

FLOPs (analytic, same counting as model_mfu.py):
    forward FLOPs / token = 2 * N_matmul + 4 * L * S * d_attn
  N_matmul: weights one token is multiplied by (model_mfu.matmul_params_per_token): q/k/v/o, the
  dense SwiGLU, the router and the k *active* experts (not all E), the LM head (d*V) for the
  actor; for the critic the same backbone with the value head (d) instead of the LM head.
  4*L*S*d_attn: QK^T and PV over the full SxS square (S = the packed row length; the model
  computes the masked scores). Backward = 2x forward, so forward+backward = 3x forward.
    PPO step = actor (1 + 3*epochs) fwd + critic (1 + 3*epochs) fwd  [+1 actor fwd with a KL
    reference] [+1 actor fwd after the update with rl.update_metrics], over every token of the packed rows (padding included: it is computed).
  MFU = analytic FLOPs / median step time / matmul peak, the peak measured in the same run
  (a float32 2048x2048 jnp.dot here, median of 5; model_mfu.matmul_peak_flops).

  .venv/bin/python experiments/benchmarks/ppo_step.py [--config configs/model/tiny.py]
      [--samples 8] [--length 256] [--steps 5] [--dtype float32|bfloat16] [--r3 both|on|off]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from configs.common import rl_config  # noqa: E402
from t1jax import sharding  # noqa: E402
from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.config import ModelConfig, model_config_from  # noqa: E402
from t1jax.model.sizes import param_counts  # noqa: E402
from t1jax.rl.trainer import Settings, Trainer  # noqa: E402
from t1jax.rollout.sample import Sample  # noqa: E402

try:  # the shared helpers of the forward+backward MFU benchmark
    from experiments.benchmarks.model_mfu import (  # noqa: E402
        dispatch_name, matmul_params_per_token, median_seconds)
except ImportError:  # run from elsewhere: same file, loaded by path
    import importlib.util
    _spec = importlib.util.spec_from_file_location(
        "model_mfu", Path(__file__).resolve().parent / "model_mfu.py")
    _mfu = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mfu)
    dispatch_name, matmul_params_per_token = _mfu.dispatch_name, _mfu.matmul_params_per_token
    median_seconds = _mfu.median_seconds


# -- machine ---------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_avg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def machine_lines() -> list[str]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    dev = jax.devices()[0]
    return [f"machine: {platform.platform()} | {cpu_model()} | cores={cores} "
            f"(cpu_count={os.cpu_count()}) | load avg {load_avg()}",
            f"python {platform.python_version()} | jax {jax.__version__} | "
            f"backend={jax.default_backend()} | devices={jax.device_count()} ({dev.device_kind})"]


# -- peak ------------------------------------------------------------------------------------

def matmul_peak(n: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
    """FLOP/s of an n x n @ n x n jnp.dot in `dtype` (float32 accumulation for bf16 on GPU is
    what XLA does by default), median of repeats."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    return 2 * n ** 3 / median_seconds(jax.jit(jnp.dot), (a, b), repeats)


# -- FLOPs -----------------------------------------------------------------------------------

def forward_flops_per_token(cfg: ModelConfig, seq: int) -> dict[str, float]:
    """Forward FLOPs per token of the actor (LM head) and the critic (value head)."""
    parts = matmul_params_per_token(cfg)
    n_actor = sum(parts.values())
    n_critic = n_actor - parts["lm_head"] + cfg.hidden_size
    attn = 4.0 * cfg.num_hidden_layers * seq * cfg.num_attention_heads * cfg.head_dim
    return {"actor": 2.0 * n_actor + attn, "critic": 2.0 * n_critic + attn,
            "n_actor": n_actor, "n_critic": n_critic, "attention": attn}


def ppo_step_flops(cfg: ModelConfig, s: Settings, rows: int, seq: int) -> float:
    """Analytic FLOPs of one PPO step over rows x seq computed tokens (see the docstring)."""
    f = forward_flops_per_token(cfg, seq)
    passes = 1 + 3 * s.epochs  # pre-update forward + epochs of forward+backward
    actor = (passes + (1 if s.uses_reference else 0) + (1 if s.update_metrics else 0)) \
        * f["actor"]
    return (actor + passes * f["critic"]) * rows * seq


# -- synthetic data --------------------------------------------------------------------------

def synthetic_samples(cfg: ModelConfig, n: int, length: int, *, turns: int = 4,
                      seed: int = 0) -> list[Sample]:
    """n trials of `length` tokens: `turns` (observation, assistant) pairs of random lengths,
    the assistant half sampled (mask 1, log-probs < 0), routes for every token on every MoE
    layer (distinct experts), -1 on dense layers, reward 0/1."""
    rng = np.random.default_rng(seed)
    k, e = cfg.num_experts_per_tok, cfg.num_experts
    moe = list(cfg.moe_layers)
    out = []
    for i in range(n):
        tokens = rng.integers(0, cfg.vocab_size, length, dtype=np.int32)
        cuts = np.sort(rng.choice(np.arange(1, length), 2 * turns - 1, replace=False))
        bounds = np.concatenate([[0], cuts, [length]])
        mask = np.zeros(length, np.int8)
        for t in range(turns):  # [obs_t, asst_t] pairs: the odd segments are the assistant's
            mask[bounds[2 * t + 1]:bounds[2 * t + 2]] = 1
        logp = np.where(mask > 0, -rng.exponential(1.0, length), 0.0).astype(np.float32)
        routes = np.full((length, cfg.num_hidden_layers, k), -1, np.int32)
        if moe:
            for layer in moe:  # one layer at a time keeps the temporary at [T, E]
                routes[:, layer] = np.argsort(rng.random((length, e)), axis=-1)[:, :k]
        out.append(Sample(tokens=tokens, loss_mask=mask, rollout_logprobs=logp, routes=routes,
                          reward=float(rng.integers(0, 2)),
                          metadata={"task_id": f"synthetic-{i}", "attempt": 0, "turns": turns}))
    return out


def rl_settings(length: int, r3: bool, **overrides) -> Settings:
    rl = rl_config()
    rl.min_length = min(rl.min_length, length)
    rl.max_length = max(length, rl.min_length)
    rl.r3 = r3
    for key, value in overrides.items():
        setattr(rl, key, value)
    return Settings.from_config(rl)


# -- timing ----------------------------------------------------------------------------------

def timed_step(trainer: Trainer, batch) -> tuple[float, dict]:
    t = time.perf_counter()
    metrics = trainer.ppo_step(batch)
    jax.block_until_ready(trainer.state)
    return time.perf_counter() - t, metrics


def run_variants(trainers: dict, batch, steps: int, max_seconds: float | None = None,
                 log=print) -> dict[str, dict]:
    """Warm-up (compile) step per trainer, then `steps` timed steps, variants alternating.
    Stops early (keeping at least one timed step each) past max_seconds of timed stepping."""
    res = {name: {"compile_s": 0.0, "times": [], "metrics": None} for name in trainers}
    for name, tr in trainers.items():
        sec, m = timed_step(tr, batch)
        res[name]["compile_s"], res[name]["metrics"] = sec, m
        log(f"  {name}: warm-up (compile) step {sec:.1f}s")
    t0 = time.perf_counter()
    for i in range(steps):
        for name, tr in trainers.items():
            sec, m = timed_step(tr, batch)
            res[name]["times"].append(sec)
            res[name]["metrics"] = m
        log(f"  step {i + 1}/{steps}: " + ", ".join(
            f"{name} {res[name]['times'][-1]:.3f}s" for name in trainers))
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            log(f"  stopping after {i + 1} timed steps (time cap {max_seconds:.0f}s)")
            break
    for r in res.values():
        r["median_s"] = statistics.median(r["times"])
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "model" / "tiny.py"))
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                        help="param_dtype and compute_dtype (default: the config's)")
    parser.add_argument("--r3", default="both", choices=("both", "on", "off"))
    parser.add_argument("--peak-n", type=int, default=2048)
    args = parser.parse_args()

    cfg = model_config_from(load_config_file(args.config).model)
    if args.dtype:
        cfg = cfg.replace(param_dtype=args.dtype, compute_dtype=args.dtype)
    if args.length > cfg.max_position_embeddings:
        raise SystemExit(f"--length {args.length} > max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    t_start = time.perf_counter()
    for line in machine_lines():
        print(line)
    peak_dtype = jnp.bfloat16 if cfg.compute_dtype == "bfloat16" and \
        jax.default_backend() != "cpu" else jnp.float32
    peak = matmul_peak(args.peak_n, peak_dtype)
    print(f"matmul peak: {jnp.dtype(peak_dtype).name} {args.peak_n}x{args.peak_n} jnp.dot "
          f"{peak / 1e9:.1f} GFLOP/s (median of 5)")

    counts = param_counts(cfg)
    print(f"config: {args.config} | params total {counts['total']:,} active {counts['active']:,} "
          f"| L={cfg.num_hidden_layers} d={cfg.hidden_size} heads={cfg.num_attention_heads}/"
          f"{cfg.num_key_value_heads}x{cfg.head_dim} E={cfg.num_experts} k="
          f"{cfg.num_experts_per_tok} F={cfg.moe_intermediate_size} V={cfg.vocab_size} "
          f"| {cfg.param_dtype}/{cfg.compute_dtype} | dispatch={dispatch_name(cfg.moe_dispatch)}")

    variants = {"both": (False, True), "on": (True,), "off": (False,)}[args.r3]
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    trainers = {}
    for r3 in variants:
        t = time.perf_counter()
        trainers[f"r3={'on' if r3 else 'off'}"] = Trainer(cfg, rl_settings(args.length, r3), mesh)
        print(f"Trainer(r3={r3}) built in {time.perf_counter() - t:.1f}s")
    first = next(iter(trainers.values()))
    samples = synthetic_samples(cfg, args.samples, args.length)
    batch, packed = first.make_batch(samples)
    rows, seq = batch.tokens.shape
    real = int(np.sum(np.asarray(batch.segment_ids) > 0))
    sampled = int(np.sum(np.asarray(batch.loss_mask)))
    print(f"batch: {args.samples} samples x {args.length} tokens -> {rows} rows x {seq} "
          f"({real} real tokens, {sampled} sampled = {sampled / real:.0%}, "
          f"{cfg.num_moe_layers} MoE layers of routes)")

    res = run_variants(trainers, batch, args.steps)
    flops = ppo_step_flops(cfg, first.s, rows, seq)
    f = forward_flops_per_token(cfg, seq)
    print(f"analytic forward FLOPs/token: actor 2*{f['n_actor']:,} + attn {f['attention']:,.0f} "
          f"= {f['actor'] / 1e6:.2f}M, critic {f['critic'] / 1e6:.2f}M; PPO step = "
          f"{1 + 3 * first.s.epochs}x(actor + critic) fwd over {rows * seq} tokens = "
          f"{flops / 1e9:.3f} GFLOP")
    header = (f"{'variant':<8} {'compile s':>9} {'median s':>9} {'min s':>7} {'tokens/s':>9} "
              f"{'GFLOP/s':>8} {'MFU':>6}")
    print(header)
    print("-" * len(header))
    for name, r in res.items():
        sec = r["median_s"]
        print(f"{name:<8} {r['compile_s']:9.1f} {sec:9.3f} {min(r['times']):7.3f} "
              f"{real / sec:9.0f} {flops / sec / 1e9:8.2f} {flops / sec / peak:6.1%}")
    for name, r in res.items():
        m = r["metrics"]
        print(f"{name} last metrics: actor/pg_loss {m.get('actor/pg_loss', float('nan')):.4f} "
              f"critic/value_loss {m.get('critic/value_loss', float('nan')):.4f} "
              f"perf/step_seconds {m['perf/step_seconds']:.3f} "
              f"perf/tokens_per_s {m['perf/tokens_per_s']:.0f}")
    if len(res) == 2:
        on, off = res["r3=on"]["median_s"], res["r3=off"]["median_s"]
        ratio = on / off
        print(f"R3 cost: step time r3=on / r3=off = {on:.3f}s / {off:.3f}s = {ratio:.3f} "
              f"(target <= 1.05: {'met' if ratio <= 1.05 else 'NOT met'})")
    print(f"load avg at the end {load_avg()} | total {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()
