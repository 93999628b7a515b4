"""The main job's rollouts with and without session prefix reuse, same trials, same run.

Each arm runs the same seeded trials (configs/tiny_cpu.py: the tiny Qwen3-MoE, the embedded
BatchingEngine over a JaxEngine with engine_batch rows, sandbox.concurrency trials at once,
max_turns, max_new_tokens, real Docker sandboxes and verification) through `episode_trial` and
the RolloutScheduler, as a PPO step does. With sessions (the main path) a trial's later turns
prefill only their new suffix and every position's route is computed once; without them every
turn re-prefills its whole prompt. Prints wall time per arm (the ratio is against no reuse, in
the same run; arms alternate, the median of --repeats is kept), prompt tokens prefilled,
session hits, rollout/route_drift and whether both arms sampled identical trajectories.

  .venv/bin/python experiments/benchmarks/prefix_reuse.py \
      [--trials 12] [--repeats 2] [--workdir runs/tiny_cpu]

--workdir: a main-job run whose pool, tokenizer and SFT actor to use (the SFT policy's replies
are the ones a PPO step samples); without it, a fresh 2-per-family pool, its tokenizer and a
random actor (replies run to max_new_tokens).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path



class WithoutSessions:
    """The engine with its sessions hidden: every call is a full prefill (the baseline)."""

    takes_sessions = False

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, sampling):
        return self.engine.generate(prompts, sampling)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", default="")
    args = parser.parse_args()

    import numpy as np
    from flax import nnx
    from tokenizers import Tokenizer

    from configs.tiny_cpu import get_config
    from t1jax.jobs.build import episode_settings, rollout_engine, sandbox_backend, trial_site
    from t1jax.model.config import model_config_from
    from t1jax.model.transformer import CausalLM
    from t1jax.rollout.scheduler import RolloutScheduler, TrialRequest, episode_trial
    from t1jax.rollout.tokenizer import train_tokenizer
    from t1jax.curation import families
    from t1jax.tasks.pool import load_pool
    from t1jax.verify.reward import pool_scale

    config = get_config()
    r = config.rollouts
    model = CausalLM(model_config_from(config.model), nnx.Rngs(config.seed))
    if args.workdir:
        from t1jax.rl import loop
        from t1jax.rl.trainer import Trainer
        from t1jax.sharding import mesh_from_config
        work = Path(args.workdir)
        pool_dir, tok = work / "pool", Tokenizer.from_file(str(work / "tokenizer.json"))
        trainer = Trainer(model_config_from(config.model), config.rl,
                          mesh_from_config(config.mesh), seed=config.seed)
        loop.load_actor_only(trainer, str(work / "sft" / "checkpoints"))
        model, policy = trainer.actor_model(), "SFT actor of " + str(work)
    else:
        pool_dir = Path(tempfile.mkdtemp(prefix="t1jax_prefix_reuse_")) / "pool"
        families.write_family_pool(pool_dir, seed=config.seed, train_per_family=2,
                                   heldout_per_family=1)
        tok = train_tokenizer(config.model.vocab_size, families.family_corpus(
            pool_dir, system_prompt=config.rollouts.system_prompt))
        policy = "random actor (seed 0)"
    tasks = load_pool(pool_dir / "train").tasks
    backend = sandbox_backend(config.sandbox)
    scale = pool_scale(tasks, config.verifier.scale_quantile, config.verifier.global_scale)
    requests = [TrialRequest(tasks[i % len(tasks)].task_id, i // len(tasks))
                for i in range(args.trials)]
    # the main job's trial site and EpisodeSettings, as its PPO rollouts play them
    site = trial_site(config, backend, run_id=f"bench-prefix-{os.getpid()}", scale=scale)
    episode = episode_settings(config, temperature=config.rl.temperature,
                               max_tokens=config.rl.max_length,
                               max_positions=config.model.max_position_embeddings,
                               engine_len=config.rl.max_length)

    def run_arm(sessions: bool, label: str) -> dict:
        batching = rollout_engine(config, config.rl.max_length, model)  # the embedded one
        engine = batching if sessions else WithoutSessions(batching)
        trial = episode_trial(site, engine, tok, {t.task_id: t for t in tasks},
                              episode=episode, seed=1234)
        scheduler = RolloutScheduler(trial, max_concurrency=config.sandbox.concurrency)
        t0 = time.perf_counter()
        step = scheduler.collect(requests, len(requests), oversample=1.0)
        wall = time.perf_counter() - t0
        if step.failed or len(step.samples) != len(requests):
            raise RuntimeError(f"{label}: {len(step.failed)} trials failed: "
                               f"{[f.error for f in step.failed][:2]}")
        stats = batching.engine.stats
        return {"wall": wall, "prefilled": stats["prefilled_tokens"],
                "hits": stats["session_hits"], "calls": batching.calls,
                "drift": sum(int(s.metadata.get("route_drift", 0)) for s in step.samples),
                "turns": sum(int(s.metadata.get("turns", 0)) for s in step.samples),
                "tokens": [np.asarray(s.tokens).tobytes() for s in step.samples]}

    print(f"machine: {platform.node()} {os.cpu_count()} cores; policy: {policy}; "
          f"{args.trials} trials, engine_batch {r.engine_batch}, concurrency "
          f"{config.sandbox.concurrency}, max_turns {r.max_turns}, max_new_tokens "
          f"{r.max_new_tokens}, {args.repeats} repeats per arm")
    try:
        run_arm(True, "warm-up")  # image builds and the compiles of both arms' buckets
        run_arm(False, "warm-up")
        runs = {True: [], False: []}
        for rep in range(args.repeats):
            for sessions in ((False, True) if rep % 2 == 0 else (True, False)):
                runs[sessions].append(run_arm(sessions, f"repeat {rep}"))
    finally:
        backend.reap(f"bench-prefix-{os.getpid()}")
    base_wall = statistics.median(x["wall"] for x in runs[False])
    print("\n| arm | wall (s, median) | vs no reuse | prompt tokens prefilled | session hits | "
          "engine calls | turns | rollout/route_drift |")
    print("|---|---|---|---|---|---|---|---|")
    for sessions, name in ((False, "full prefill every turn (baseline)"),
                           (True, "session prefix reuse (main path)")):
        x = runs[sessions][-1]
        wall = statistics.median(y["wall"] for y in runs[sessions])
        print(f"| {name} | {wall:.1f} | {base_wall / wall:.2f}x | {x['prefilled']} | "
              f"{x['hits']} | {x['calls']} | {x['turns']} | {x['drift']} |")
    same = sum(a == b for a, b in zip(runs[True][-1]["tokens"], runs[False][-1]["tokens"]))
    print(f"\nidentical trajectories (tokens) across arms: {same}/{args.trials}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
