"""SFT rows that share their opening tokens run them once (rl.share_prefix): SFT step time.

The main job's SFT rows are 384 tokens holding one 308-329-token episode each, and every
episode opens with the same 248 tokens (system prompt, tool schema, the user header). With
rl.share_prefix the step runs those once on one row and broadcasts their keys and values
(t1jax/rl/shared_prefix.py). This times `Trainer.sft_step` of configs/tiny_cpu.py with it off
(the baseline of the printed ratio) and on, same seed, steps alternating between them, on
batches of that shape: synthetic ids with a common 248-token opening by default, or the first
samples of a run's SFT data (--sft_data runs/tiny_cpu/sft/sft_data). It also prints the
largest difference of their NLLs.

  .venv/bin/python experiments/benchmarks/shared_prefix.py \
      [--sft_data DIR] [--samples 16] [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import time


import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import tiny_cpu  # noqa: E402
from experiments.benchmarks.ppo_step import machine_lines  # noqa: E402
from t1jax.jobs import build  # noqa: E402
from t1jax.rollout.sample import Sample, load_samples  # noqa: E402

OPENING, TRAINED_FROM, LENGTHS = 248, 265, (308, 329)  # the main job's SFT samples (measured)


def main_job_like(n: int, vocab: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    opening = rng.integers(1, vocab, OPENING)
    out = []
    for i in range(n):
        length = int(rng.integers(LENGTHS[0], LENGTHS[1] + 1))
        tokens = np.concatenate([opening, rng.integers(1, vocab, length - OPENING)])
        mask = (np.arange(length) >= TRAINED_FROM).astype(np.int8)
        out.append(Sample(tokens=tokens, loss_mask=mask, rollout_logprobs=np.zeros(length),
                          routes=np.full((length, 4, 2), -1), reward=0.0,
                          metadata={"task_id": f"t{i}"}))
    return out


def trainer_for(share: bool):
    config = tiny_cpu.get_config()
    config.rl.share_prefix = share
    return build.trainer(config, build.mesh_from(config), sft_steps=config.sft.steps)


def timed(trainer, batch) -> tuple[float, dict]:
    t = time.perf_counter()
    metrics = trainer.sft_step(batch)
    jax.block_until_ready(trainer.state)
    return time.perf_counter() - t, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sft_data", default="")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    for line in machine_lines():
        print(line)
    vocab = tiny_cpu.get_config().model.vocab_size
    pool = (load_samples(args.sft_data) if args.sft_data else
            main_job_like(args.samples * (args.steps + 1), vocab))
    batches = [pool[i * args.samples:(i + 1) * args.samples] for i in range(args.steps + 1)]
    print(f"{args.samples} samples per step from {args.sft_data or 'synthetic ids'}; "
          f"{args.steps} timed steps per variant, variants alternating, a new batch each step")
    trainers = {share: trainer_for(share) for share in (False, True)}
    first = {share: timed(t, batches[0]) for share, t in trainers.items()}
    times, nll_gap = {False: [], True: []}, 0.0
    for batch in batches[1:]:
        step = {share: timed(t, batch) for share, t in trainers.items()}
        for share, (seconds, _) in step.items():
            times[share].append(seconds)
        nll_gap = max(nll_gap, abs(step[True][1]["sft/nll"] - step[False][1]["sft/nll"]))
    base = statistics.median(times[False])
    print("\nsft step | shared prefix (tokens) | first step incl. compile (s) | median step (s) "
          "| vs full rows")
    for share in (False, True):
        med = statistics.median(times[share])
        print(f"  share_prefix={share} | {first[share][1]['perf/shared_prefix']} | "
              f"{first[share][0]:.1f} | {med:.3f} | {base / med:.2f}x")
    print(f"largest |NLL difference| over the timed steps: {nll_gap:.2e}")


if __name__ == "__main__":
    main()
