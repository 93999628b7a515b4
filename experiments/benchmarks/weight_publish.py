"""Weight publish (P7): seconds to write the policy as HF safetensors for the fleet
(`export_hf`, what `build.publish_weights` writes before the servers load it), against this
machine's disk write bandwidth measured in the same run.

The policy is a Qwen3-MoE of about --gb gigabytes in bf16 (its own dtype, what the real configs
publish), random weights, on this process's CPU devices. The disk baseline writes the same
number of bytes in 64 MiB blocks to the same folder, once as a publish does (write and close,
the page cache absorbing it) and once forced to the device (fsync), which bounds what a disk
sustains once the cache is full. The model is written in --shard-mb shards (a shard is written
on a thread while the next is converted), as a real model's 4 GiB shards are. Ratio: the baseline's seconds / the publish's (1.0 = as fast as
the disk). The publish is also timed as a float32 copy (what it wrote before: twice the bytes).

  .venv/bin/python experiments/benchmarks/weight_publish.py [--gb 1.0] [--dir /tmp]
      [--shard-mb 256]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path


import numpy as np  # noqa: E402


def disk_write(folder: Path, nbytes: int, fsync: bool) -> float:
    """Seconds to write nbytes in 64 MiB blocks (and close; fsync if asked)."""
    block = np.random.default_rng(0).integers(0, 255, 64 << 20, np.uint8).tobytes()
    path = folder / "disk_baseline.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(block[:min(left, len(block))])
            left -= len(block)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return seconds


def model_of(gb: float):
    """A Qwen3-MoE CausalLM of about `gb` GB in bf16 (8 layers, width 1024, experts scaled)."""
    from flax import nnx

    from t1jax.model.config import ModelConfig
    from t1jax.model.sizes import param_counts
    from t1jax.model.transformer import CausalLM
    base = dict(vocab_size=32768, hidden_size=1024, intermediate_size=2048,
                moe_intermediate_size=512, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=4, head_dim=128, num_experts_per_tok=4,
                param_dtype="bfloat16", compute_dtype="bfloat16")
    four, five = (param_counts(ModelConfig(**base, num_experts=n))["total"] for n in (4, 5))
    per_expert = five - four
    rest = four - 4 * per_expert
    experts = max(4, int((gb * 1e9 / 2 - rest) / per_expert))
    cfg = ModelConfig(**base, num_experts=experts)
    return CausalLM(cfg, nnx.Rngs(0)), param_counts(cfg)["total"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shard-mb", type=int, default=256,
                    help="safetensors shard size (a real publish: 4096 MiB shards, 15 for 30B)")
    args = ap.parse_args()
    from t1jax.model.hf_io import export_hf
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="publish_bench_"))
    try:
        t0 = time.perf_counter()
        model, params = model_of(args.gb)
        print(f"model: {params / 1e9:.2f}B parameters ({time.perf_counter() - t0:.0f} s to "
              f"build); writing to {root}", flush=True)
        rows = []
        for r in range(args.repeats):
            t0 = time.perf_counter()
            out = export_hf(model, root / f"weights_{r}", max_shard_bytes=args.shard_mb << 20)
            seconds = time.perf_counter() - t0
            nbytes = sum(p.stat().st_size for p in out.iterdir())
            shutil.rmtree(out)
            cached = disk_write(root, nbytes, fsync=False)
            synced = disk_write(root, nbytes, fsync=True)
            rows.append((seconds, nbytes, cached, synced))
            print(f"repeat {r}: publish {seconds:.2f} s for {nbytes / 1e9:.2f} GB; disk "
                  f"{cached:.2f} s (page cache), {synced:.2f} s (fsync)", flush=True)
        t0 = time.perf_counter()
        f32 = export_hf(model, root / "weights_f32", dtype="float32",
                        max_shard_bytes=args.shard_mb << 20)
        f32_seconds = time.perf_counter() - t0
        f32_bytes = sum(p.stat().st_size for p in f32.iterdir())
        shutil.rmtree(f32)
        seconds, nbytes, cached, synced = (float(np.median([row[i] for row in rows]))
                                           for i in range(4))
        rate = nbytes / seconds
        print("| what | GB | seconds (median) | GB/s | vs disk, page cache | vs disk, fsync |")
        print("|---|---|---|---|---|---|")
        print(f"| publish (bf16, export_hf) | {nbytes / 1e9:.2f} | {seconds:.2f} | "
              f"{rate / 1e9:.2f} | {cached / seconds:.2f} | {synced / seconds:.2f} |")
        print(f"| disk write, page cache | {nbytes / 1e9:.2f} | {cached:.2f} | "
              f"{nbytes / cached / 1e9:.2f} | 1.00 | |")
        print(f"| disk write, fsync | {nbytes / 1e9:.2f} | {synced:.2f} | "
              f"{nbytes / synced / 1e9:.2f} | | 1.00 |")
        print(f"| publish as float32 (before) | {f32_bytes / 1e9:.2f} | {f32_seconds:.2f} | "
              f"{f32_bytes / f32_seconds / 1e9:.2f} | | |")
        for name, billions in (("Qwen3-30B-A3B", 30.5), ("Qwen3.5-122B-A10B", 122.1)):
            gb = billions * 2
            print(f"{name}: {gb:.0f} GB in bf16 at this publish rate ({rate / 1e9:.2f} GB/s) = "
                  f"{gb * 1e9 / rate:.0f} s from one process; split over N processes (each "
                  f"writes every N-th shard) / N where the disk keeps up")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
