"""Query blocks in the naive attention (model.causal_query_blocks): SFT and PPO step time.

The main job's training rows are 384 tokens holding one ~317-token episode each; on CPU the
naive attention's [16, 2, 4, 384, 384] score tensors (forward, mask, softmax, backward) were
64% of an SFT step (an XLA trace of 3 steps, 2026-12-05). `attend_causal` cuts the queries into
blocks that score only the keys up to their own end. This times `Trainer.sft_step` and
`Trainer.ppo_step` of configs/tiny_cpu.py's model (rl settings of the main job) on a synthetic
batch of that shape, one Trainer per block count, same seed, steps alternating between them;
block count 1 (the whole score matrix) is the baseline of the printed ratios.

  .venv/bin/python experiments/benchmarks/causal_attention.py \
      [--blocks 1,4,6,8] [--samples 16] [--length 317] [--row 384] [--steps 8] [--stage sft,ppo]
"""

from __future__ import annotations

import argparse
import statistics
import time


import jax  # noqa: E402

from configs import tiny_cpu  # noqa: E402
from experiments.benchmarks.ppo_step import machine_lines, synthetic_samples  # noqa: E402
from t1jax.jobs import build  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402


def trainer_for(blocks: int, row: int, stage: str):
    config = tiny_cpu.get_config()
    config.model.causal_query_blocks = blocks
    config.rl.min_length = config.rl.max_length = row
    return build.trainer(config, build.mesh_from(config),
                         sft_steps=config.sft.steps if stage == "sft" else None)


def timed(trainer, stage: str, samples) -> float:
    t = time.perf_counter()
    (trainer.sft_step if stage == "sft" else trainer.ppo_step)(samples)
    jax.block_until_ready(trainer.state)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="1,4,6,8")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--length", type=int, default=317)
    parser.add_argument("--row", type=int, default=384)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--stage", default="sft,ppo")
    args = parser.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    if blocks[0] != 1:
        blocks = [1] + [b for b in blocks if b != 1]
    for line in machine_lines():
        print(line)
    cfg = model_config_from(tiny_cpu.get_config().model)
    samples = synthetic_samples(cfg, args.samples, args.length)
    print(f"{args.samples} samples of {args.length} tokens in {args.row}-token rows; "
          f"{args.steps} timed steps per variant, variants alternating")
    for stage in args.stage.split(","):
        trainers = {b: trainer_for(b, args.row, stage) for b in blocks}
        compile_s = {b: timed(t, stage, samples) for b, t in trainers.items()}
        times = {b: [] for b in blocks}
        for _ in range(args.steps):
            for b, t in trainers.items():
                times[b].append(timed(t, stage, samples))
        base = statistics.median(times[1])
        print(f"\n{stage} step | first step incl. compile (s) | median step (s) | vs 1 block")
        for b in blocks:
            med = statistics.median(times[b])
            print(f"  {b} blocks | {compile_s[b]:.1f} | {med:.3f} | {base / med:.2f}x")


if __name__ == "__main__":
    main()
