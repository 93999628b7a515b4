"""Embedded JaxEngine vs HF transformers `generate`: decode tokens/s and time to first token.

Both run the same random weights (t1jax's `CausalLM` → `export_hf` → transformers'
`Qwen3MoeForCausalLM.from_pretrained`), greedy, on the CPU; torch with `torch.set_num_threads(2)`.
Time to first token (TTFT) = a whole call with max_new_tokens=1 (prefill + first sample);
decode tokens/s = B·(N-1) / (t(N new tokens) - TTFT). Each time is the median of --repeats,
after one warm-up call of each kind (JAX compiles excluded), the four kinds of call
interleaved. Ratios are JaxEngine / HF, same run.

  .venv/bin/python experiments/benchmarks/engine_decode.py \
      [--batches 1,16] [--prompt 64] [--new 64] [--repeats 3] [--config configs/model/tiny.py]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time


import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.model.hf_io import export_hf, num_params  # noqa: E402
from t1jax.model.transformer import CausalLM  # noqa: E402
from t1jax.rollout.engine import SamplingParams  # noqa: E402
from t1jax.rollout.jax_engine import JaxEngine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/model/tiny.py")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    import transformers
    torch.set_num_threads(args.torch_threads)

    cfg = model_config_from(load_config_file(args.config).model)
    model = CausalLM(cfg, nnx.Rngs(0))
    tmp = tempfile.TemporaryDirectory()
    export_hf(model, tmp.name)
    hf = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp.name, dtype=torch.float32).eval()
    load = os.getloadavg()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; python "
          f"{platform.python_version()}, jax {jax.__version__} ({jax.default_backend()}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
          f"{transformers.__version__}")
    print(f"model: {args.config}, {num_params(model) / 1e6:.2f}M parameters, "
          f"{cfg.num_experts} experts top-{cfg.num_experts_per_tok}, {cfg.compute_dtype}; "
          f"prompt {args.prompt} tokens, {args.new} new tokens, greedy, median of {args.repeats}")

    rng = np.random.default_rng(0)
    max_len = args.prompt + args.new
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        prompts = rng.integers(1, cfg.vocab_size, size=(b, args.prompt)).tolist()
        engine = JaxEngine(model, max_batch=b, max_len=max_len, prefill_buckets=(args.prompt,))

        def jax_run(n, engine=engine, prompts=prompts):
            return engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n))

        ids = torch.tensor(prompts, dtype=torch.long)
        mask = torch.ones_like(ids)

        def hf_run(n, ids=ids, mask=mask):
            with torch.inference_mode():
                return hf.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                   max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                                   pad_token_id=0)

        # Same weights, same greedy tokens (a check that the comparison is like for like).
        ours = np.array([r.output_ids for r in jax_run(args.new)])
        theirs = hf_run(args.new)[:, args.prompt:].numpy()
        agree = float((ours == theirs).mean())
        runs = {"jax": jax_run, "hf": hf_run}
        times = {(name, n): [] for name in runs for n in (1, args.new)}
        for name, n in times:  # warm-up (compiles, allocator)
            runs[name](n)
        for _ in range(args.repeats):  # interleaved, so a change in load hits both engines
            for (name, n), ts in times.items():
                t = time.perf_counter()
                runs[name](n)
                ts.append(time.perf_counter() - t)
        res = {}
        for name in runs:
            ttft = statistics.median(times[name, 1])
            full = statistics.median(times[name, args.new])
            res[name] = (ttft, b * (args.new - 1) / max(full - ttft, 1e-9), full)
        rows.append((b, res, agree))
        print(f"B={b}: jax ttft {res['jax'][0] * 1e3:.1f} ms, decode {res['jax'][1]:.0f} tok/s; "
              f"hf ttft {res['hf'][0] * 1e3:.1f} ms, decode {res['hf'][1]:.0f} tok/s; "
              f"greedy ids agree {agree:.3f}", flush=True)

    print()
    print("| batch | engine | TTFT (ms) | decode tok/s | end-to-end tok/s | decode vs HF | "
          "TTFT vs HF |")
    print("|---|---|---|---|---|---|---|")
    for b, res, agree in rows:
        for name, label in (("hf", "HF transformers generate (baseline)"), ("jax", "JaxEngine")):
            ttft, dec, full = res[name]
            print(f"| {b} | {label} | {ttft * 1e3:.1f} | {dec:.0f} | {b * args.new / full:.0f} | "
                  f"{dec / res['hf'][1]:.2f}x | {res['hf'][0] / ttft:.2f}x |")
    print("(TTFT vs HF > 1: JaxEngine's first token comes sooner; greedy-id agreement: "
          + ", ".join(f"B={b} {a:.3f}" for b, _, a in rows) + ")")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
