"""Compile time of a training step: scan_layers' stacked parameter storage against per-layer
storage re-stacked on every forward (t1jax before 2026-12-03).

Both variants run the same scanned model (`scan_layers=True`, remat) and the same step: loss,
gradients, global-norm clipping and Adam (optax), jitted. They differ only in how the train state
holds the repeating layers:
  stacked    one array per block position with a leading layer axis (Transformer.blocks), as
             the model stores them: the optimizer and clip see a few arrays;
  per-layer  one array per layer and parameter (the baseline); the step stacks them for the
             scan on every forward, and the gradient flows back through the stack, so Adam,
             clip and the gradient run once per layer.
Parameters stay abstract (no weights materialised). Reported per variant: lowering and compile
seconds (fastest of --repeats, alternating), instructions in the optimized program,
train-state leaves; then per-layer / stacked.

  .venv/bin/python experiments/benchmarks/layer_storage_compile.py
      [--config configs/model/tiny.py] [--layers 48] [--rows 2] [--length 512] [--repeats 2]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.model.transformer import CausalLM  # noqa: E402


def per_layer(state):
    """The baseline's train state: each stacked block split into its layers' arrays."""
    return {key(path): ([jax.ShapeDtypeStruct(v.shape[1:], v.dtype)] * v.shape[0]
                        if "blocks" in path else jax.ShapeDtypeStruct(v.shape, v.dtype))
            for path, v in ((p, var.get_value()) for p, var in nnx.to_flat_state(state))}


def key(path) -> str:
    return "/".join(map(str, path))


def restack(template, params):
    """The model's state from per-layer arrays: what the baseline did on every forward."""
    return nnx.from_flat_state([
        (path, var.replace(jnp.stack(params[key(path)]) if "blocks" in path
                           else params[key(path)]))
        for path, var in nnx.to_flat_state(template)])


def compile_step(graphdef, template, params, tokens, stacked: bool) -> dict:
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-5))

    def loss(p, tokens_):
        state = p if stacked else restack(template, p)
        out = nnx.merge(graphdef, state)(tokens_)
        return jnp.mean(out.logits ** 2) + out.aux_loss

    def step(p, opt, tokens_):
        grads = jax.grad(loss)(p, tokens_)
        updates, opt = tx.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt

    opt = jax.eval_shape(tx.init, params)
    t0 = time.perf_counter()
    lowered = jax.jit(step).lower(params, opt, tokens)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    text = compiled.as_text()
    return dict(lower_s=t1 - t0, compile_s=t2 - t1, leaves=len(jax.tree.leaves(params)),
                instructions=sum(1 for line in text.splitlines() if " = " in line))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs/model/tiny.py"))
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    base = model_config_from(load_config_file(args.config).model)
    changes = dict(num_hidden_layers=args.layers, scan_layers=True, remat=True)
    if base.layer_types:  # Qwen3.5: its block of layer kinds repeated to the depth asked for
        changes["layer_types"] = tuple(base.layer_types[i % len(base.layer_types)]
                                       for i in range(args.layers))
    cfg = base.replace(**changes)
    model = nnx.eval_shape(lambda: CausalLM(cfg, nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    tokens = jax.ShapeDtypeStruct((args.rows, args.length), jnp.int32)
    print(f"{platform.node()} {jax.devices()[0].platform}, {cfg.model_type} {args.layers} layers "
          f"(hidden {cfg.hidden_size}), {args.rows} x {args.length} tokens, remat + scan_layers")
    results = {}
    for _ in range(args.repeats):  # alternating; the fastest of each (the first pays warm-up)
        for name, stacked in (("stacked", True), ("per-layer", False)):
            params = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype),
                                  state) if stacked else per_layer(state)
            r = compile_step(graphdef, state, params, tokens, stacked)
            best = results.setdefault(name, r)
            for k in ("lower_s", "compile_s"):
                best[k] = min(best[k], r[k])
    for name, r in results.items():
        print(f"{name:>9}: {r['leaves']:5d} state leaves, lower {r['lower_s']:6.1f} s, compile "
              f"{r['compile_s']:6.1f} s, {r['instructions']} instructions")
    s, b = results["stacked"], results["per-layer"]
    print(f"per-layer / stacked: lower {b['lower_s'] / s['lower_s']:.2f}x, compile "
          f"{b['compile_s'] / s['compile_s']:.2f}x, instructions "
          f"{b['instructions'] / s['instructions']:.2f}x")


if __name__ == "__main__":
    main()
