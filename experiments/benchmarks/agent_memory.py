"""Memory of a long episode under context compaction: the agent's Python heap and the process's
RSS as the episode grows from tens to hundreds of turns, with the real embedded JaxEngine
(tiny random model) whose cache is one chunk. A short episode first compiles the engine's steps,
outside the measurement.

Why: a trial of hundreds of turns must not grow what the engine holds (one chunk's positions)
and should grow what the agent holds only by the training sample itself. The ratios printed are
the heap's bytes per trial token against the shortest episode's (flat means linear in the
trial, nothing quadratic such as every prompt of the episode kept) and against the bytes of the
compact training sample (tokens, mask, log-probs, routes as Sample stores them).

The random model would answer "done" at a random stop id, so stop ids are dropped: every reply
is cut at max_new_tokens and answered with an error, and the episode runs until max_turns. The
sandbox is an in-process double that echoes a fixed line (a real sandbox's memory lives in its
container, not in this process). The heap is tracemalloc's peak (Python allocations, including
the engine's host-side arrays); RSS is the process's high-water mark, so episodes run shortest
first.

  .venv/bin/python experiments/benchmarks/agent_memory.py [--turns 10,100,300]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import resource
import time
import tracemalloc
from types import SimpleNamespace


from flax import nnx  # noqa: E402

from experiments.benchmarks.context_lengths import cache_bytes  # noqa: E402
from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.model.transformer import CausalLM  # noqa: E402
from t1jax.rollout import context as ctx  # noqa: E402
from t1jax.rollout.agent import run_agent_episode  # noqa: E402
from t1jax.rollout.chat import render_prefix  # noqa: E402
from t1jax.rollout.engine import SeededCalls  # noqa: E402
from t1jax.rollout.settings import EpisodeSettings  # noqa: E402
from t1jax.rollout.jax_engine import JaxEngine  # noqa: E402
from t1jax.rollout.sample import Sample  # noqa: E402
from t1jax.rollout.tokenizer import train_tokenizer  # noqa: E402

SYSTEM = "Use the bash tool."
TASK = SimpleNamespace(instruction="Count the lines of /app/data.txt and write the number to "
                                   "/app/out.txt.", agent=None)


class EchoSandbox:
    def exec(self, cmd: str, timeout: float | None = None):
        return SimpleNamespace(output="ok\n", exit_code=0, timed_out=False, truncated=False)


class NeverStops:
    """The engine with the agent's stop ids removed from every request."""

    def __init__(self, engine):
        self.engine, self.max_len = engine, engine.max_len

    def generate(self, prompts, sampling):
        return self.engine.generate(prompts, dataclasses.replace(sampling, stop_token_ids=()))


def sample_bytes(traj) -> int:
    s = Sample(traj.tokens, traj.loss_mask, traj.logprobs, traj.routes, 0.0, {},
               chunk_starts=traj.chunk_starts)
    return sum(x.nbytes for x in (s.tokens, s.loss_mask, s.rollout_logprobs, s.routes))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/model/tiny.py")
    parser.add_argument("--turns", default="10,100,300")
    parser.add_argument("--room", type=int, default=512, help="chunk tokens past the prompt")
    parser.add_argument("--max-new", type=int, default=16)
    args = parser.parse_args()
    tok = train_tokenizer()
    model_config = load_config_file(args.config).model
    model_config.vocab_size = tok.get_vocab_size()
    cfg = model_config_from(model_config)
    model = CausalLM(cfg, nnx.Rngs(0))
    prompt = len(tok.encode(render_prefix(SYSTEM, TASK.instruction),
                            add_special_tokens=False).ids)
    budget = prompt + args.room
    engine = NeverStops(JaxEngine(model, max_batch=1, max_len=budget,
                                  prefill_buckets=(budget,)))
    policy = ctx.ContextPolicy(budget, "elide", reserve=4 * args.max_new)
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load[0]:.1f}; "
          f"model {args.config}; chunk budget {budget} tokens (prompt {prompt}); engine KV "
          f"cache {cache_bytes(cfg, budget) / 2**20:.2f} MiB, one row")
    def episode(turns: int):
        return run_agent_episode(
            TASK, SeededCalls(engine, 0, TASK.task_id, 0), tok, EchoSandbox(), EpisodeSettings(
                max_turns=turns, max_tokens=1 << 24, system_prompt=SYSTEM, context=policy,
                temperature=1.0, max_new_tokens=args.max_new))

    episode(8)  # compiles the engine's steps outside the measurement
    rows, base = [], None
    for turns in sorted(int(x) for x in args.turns.split(",")):
        tracemalloc.start()
        t0 = time.perf_counter()
        traj = episode(turns)
        wall = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
        n = len(traj.tokens)
        per_token = peak / n
        base = base or per_token
        rows.append((turns, traj.compactions + 1, n, peak / 2**20, per_token, per_token / base,
                     per_token / (sample_bytes(traj) / n), rss, wall))
        assert traj.turns == turns, (traj.turns, traj.finish)
    print("| turns | chunks | trial tokens | heap peak (MiB) | heap B/token | vs shortest | "
          "vs sample bytes | RSS high-water (GiB) | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t, c, n, peak, per, flat, over, rss, wall in rows:
        print(f"| {t} | {c} | {n:,} | {peak:.1f} | {per:.0f} | {flat:.2f}x | {over:.1f}x | "
              f"{rss:.2f} | {wall:.0f} |")


if __name__ == "__main__":
    main()
