"""Model FLOP utilisation of one training step of the policy (CausalLM) on this machine.

The step is jax.jit(jax.value_and_grad(loss)) with loss = mean next-token cross-entropy over the LM
logits, differentiated w.r.t. all parameters; tokens are random. Reported: step time (median of
--repeats after a compile/warm-up call), tokens/s, FLOP/s and MFU against a float32 matmul peak
measured in the same run (2048x2048 @ 2048x2048, median of repeats), since on a shared CPU the
peak moves with the load.

FLOPs are counted two ways:
  analytic  per token, forward+backward:
                6 * N_matmul + 12 * L * S * d_attn
            N_matmul: the weights one token multiplies by, counted once: per layer q, k, v, o
            projections; the dense SwiGLU (3*d*I) in dense layers; in MoE layers the router
            (d*E) and the k *active* experts (k*3*d*F), not all E; plus the LM head (d*V, a real
            matmul even when tied). The embedding lookup is a gather and is not counted.
            12*L*S*d_attn (d_attn = heads*head_dim): QK^T and PV, 2*2*S*d_attn forward per
            layer, x3 for backward, over the full SxS square (the model computes the masked
            scores, it does not skip the causal half). Norms, RoPE, softmax, routing and the
            loss are left out (elementwise, O(d) per token).
            MFU = analytic FLOPs / step time / matmul peak.
  xla       compiled.cost_analysis()['flops'] of the same step: what XLA says it executes,
            including elementwise work and whatever the MoE dispatch really does on this
            backend (e.g. a ragged_dot lowered as a dense dot over all experts).

  .venv/bin/python experiments/benchmarks/model_mfu.py [--config configs/model/tiny.py]
      [--batch 8] [--seq 256] [--repeats 5] [--dispatch auto|<a t1jax.model.dispatch strategy>]
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
from flax import nnx  # noqa: E402

from t1jax import sharding  # noqa: E402
from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.config import ModelConfig, model_config_from  # noqa: E402
from t1jax.model.sizes import param_counts  # noqa: E402
from t1jax.model import dispatch as moe_dispatch  # noqa: E402
from t1jax.model.transformer import CausalLM  # noqa: E402




def median_seconds(fn, args, repeats: int) -> float:
    """Median wall time of fn(*args) after one excluded warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    return 2 * n ** 3 / median_seconds(jax.jit(jnp.matmul), (a, b), repeats)


def matmul_params_per_token(cfg: ModelConfig) -> dict[str, int]:
    """Weights each token is multiplied by (counted once), by part; see the module docstring."""
    d, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    n_moe = cfg.num_moe_layers
    n_dense = cfg.num_hidden_layers - n_moe
    return {
        "attention": cfg.num_hidden_layers * (d * q + 2 * d * kv + q * d),
        "dense_mlp": n_dense * 3 * d * cfg.intermediate_size,
        "moe_active": n_moe * (cfg.num_experts_per_tok * 3 * d * cfg.moe_intermediate_size
                               + d * cfg.num_experts),
        "lm_head": d * cfg.vocab_size,
    }


def analytic_flops_per_token(cfg: ModelConfig, seq: int) -> tuple[float, float]:
    """(6 * N_matmul, 12 * L * S * d_attn): forward+backward FLOPs per token."""
    n = sum(matmul_params_per_token(cfg).values())
    d_attn = cfg.num_attention_heads * cfg.head_dim
    return 6.0 * n, 12.0 * cfg.num_hidden_layers * seq * d_attn


def xla_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 (not every backend implements it)
        return None
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


def dispatch_name(strategy: str) -> str:
    """The concrete MoE dispatch `strategy` resolves to here ("auto" -> the backend's choice)."""
    try:
        return f"{strategy} -> {moe_dispatch.resolve_strategy(strategy)}"
    except (AttributeError, TypeError):  # a dispatch module without this helper
        return strategy


def make_step(graphdef):
    def loss(params, tokens):
        logits = nnx.merge(graphdef, params)(tokens).logits[:, :-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))
    return jax.jit(jax.value_and_grad(loss))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "model" / "tiny.py"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dispatch", default=None,
                        help="override the config's moe_dispatch (auto or a strategy name)")
    args = parser.parse_args()

    cfg = model_config_from(load_config_file(args.config).model)
    if args.dispatch:
        cfg = cfg.replace(moe_dispatch=args.dispatch)
    b, s = args.batch, args.seq
    if s > cfg.max_position_embeddings:
        raise SystemExit(f"--seq {s} > max_position_embeddings {cfg.max_position_embeddings}")

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " ".join(f"{v:.1f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"machine: {platform.platform()} | {platform.processor() or platform.machine()} | "
          f"cores={cores} (cpu_count={os.cpu_count()}) | load avg {load}")
    print(f"jax {jax.__version__} | backend={jax.default_backend()} | "
          f"devices={jax.device_count()} ({jax.devices()[0].device_kind})")

    peak = matmul_peak_flops(repeats=max(args.repeats, 5))
    print(f"float32 2048x2048 matmul peak: {peak / 1e9:.1f} GFLOP/s (median of "
          f"{max(args.repeats, 5)})")

    counts = param_counts(cfg)
    per_part = matmul_params_per_token(cfg)
    dispatch = dispatch_name(cfg.moe_dispatch)
    print(f"config: {args.config} | params total {counts['total']:,} active {counts['active']:,} "
          f"| L={cfg.num_hidden_layers} d={cfg.hidden_size} heads={cfg.num_attention_heads}/"
          f"{cfg.num_key_value_heads}x{cfg.head_dim} E={cfg.num_experts} k="
          f"{cfg.num_experts_per_tok} F={cfg.moe_intermediate_size} V={cfg.vocab_size} "
          f"| {cfg.param_dtype}/{cfg.compute_dtype} | dispatch={dispatch}")
    print("N_matmul per token: " + ", ".join(f"{k} {v:,}" for k, v in per_part.items())
          + f" = {sum(per_part.values()):,}")

    # Parameters built by a compiled init on one device (eager init is op-by-op and slow).
    one = sharding.make_mesh(devices=jax.devices()[:1])
    graphdef, params = nnx.split(sharding.create_sharded(lambda: CausalLM(cfg, nnx.Rngs(0)), one))
    tokens = jax.random.randint(jax.random.key(1), (b, s), 0, cfg.vocab_size, jnp.int32)
    step = make_step(graphdef)

    t = time.perf_counter()
    compiled = step.lower(params, tokens).compile()
    compile_s = time.perf_counter() - t
    flops_xla = xla_flops(compiled)
    sec = median_seconds(compiled, (params, tokens), args.repeats)
    loss = float(compiled(params, tokens)[0])

    n_tok = b * s
    dense_pt, attn_pt = analytic_flops_per_token(cfg, s)
    flops_an = (dense_pt + attn_pt) * n_tok
    print(f"step: B={b} S={s} ({n_tok} tokens) | compile {compile_s:.1f}s | loss {loss:.3f} "
          f"(ln V = {jnp.log(cfg.vocab_size):.3f}) | median of {args.repeats}")
    print(f"analytic FLOPs/token: 6N {dense_pt / 1e6:.2f}M + attention {attn_pt / 1e6:.2f}M "
          f"= {(dense_pt + attn_pt) / 1e6:.2f}M")
    header = (f"{'FLOP count':<10} {'GFLOP/step':>10} {'ms/step':>8} {'tokens/s':>9} "
              f"{'GFLOP/s':>8} {'of peak':>8}")
    print(header)
    print("-" * len(header))
    rows = [("analytic", flops_an)]
    if flops_xla is not None:
        rows.append(("xla", flops_xla))
    for name, flops in rows:
        rate = flops / sec
        print(f"{name:<10} {flops / 1e9:10.3f} {sec * 1e3:8.1f} {n_tok / sec:9.0f} "
              f"{rate / 1e9:8.2f} {rate / peak:8.1%}")
    if flops_xla is None:
        print("xla: cost_analysis() gave no 'flops' on this backend")
    else:
        print(f"xla / analytic FLOPs = {flops_xla / flops_an:.2f}")
    print(f"MFU (analytic FLOPs / measured f32 matmul peak) = {flops_an / sec / peak:.1%}")


if __name__ == "__main__":
    main()
