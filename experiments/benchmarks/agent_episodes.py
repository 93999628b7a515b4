"""Agent episodes per minute with 1, 4 and 8 sandboxes at once: the rollout harness + sandboxes.

An episode = a fresh sandbox, `run_agent_episode` with a scripted engine, then verification.
The scripted engine is a stand-in for a model: its first reply is one bash tool call that runs
the task's own solution/solve.sh (with the task's [solution] env), its second a final answer.
So the number measures the harness (tokenisation, chat rendering, tool-call parsing, TITO
record and audit) + the sandboxes + verification, not generation. Ratios are against one
sandbox at a time, measured in the same run.

  .venv/bin/python experiments/benchmarks/agent_episodes.py \
      [--episodes 16] [--concurrency 1,4,8] [--tasks 8] [--backend docker]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import time
import uuid


import numpy as np  # noqa: E402

from t1jax.rollout.agent import run_agent_episode  # noqa: E402
from t1jax.rollout.chat import IM_END, render_tool_call  # noqa: E402
from t1jax.rollout.engine import FINISH_STOP, GenerateResult  # noqa: E402
from t1jax.rollout.settings import EpisodeSettings  # noqa: E402
from t1jax.rollout.fan_out import fan_out  # noqa: E402
from t1jax.rollout.tokenizer import train_tokenizer  # noqa: E402
from t1jax.rollout.trial import TrialSite, run_trial  # noqa: E402
from t1jax.sandbox import make_backend  # noqa: E402
from t1jax.tasks.pool import default_pool_dir, load_pool  # noqa: E402
from t1jax.verify.reward import pool_scale  # noqa: E402

LAYERS, K = 3, 2
EPISODE = EpisodeSettings(temperature=1.0, max_new_tokens=4096)


def solve_command(task) -> str:
    """The task's solve.sh as one bash command (a heredoc), with its [solution] env exported."""
    script = task.solution_script.read_text()
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in task.solution.env.items())
    marker = f"T1JAX_SOLVE_{uuid.uuid4().hex[:8]}"
    return f"{'export ' + env + '; ' if env else ''}bash <<'{marker}'\n{script}\n{marker}"


class ReplayEngine:
    """Replies with pre-written texts (real tokenizer, closed by <|im_end|>), fake log-probs and
    routes of the contract's shape; one engine per episode."""

    weight_version = "scripted"
    max_len = 32768

    def __init__(self, tok, texts):
        self.tok, self.texts = tok, list(texts)
        self.end = tok.token_to_id(IM_END)

    def generate(self, prompts, sampling):
        (prompt,) = prompts
        ids = self.tok.encode(self.texts.pop(0), add_special_tokens=False).ids + [self.end]
        rows = len(prompt) + len(ids) - 1
        routes = (np.arange(rows * LAYERS * K) % 7).reshape(rows, LAYERS, K).astype(np.int32)
        return [GenerateResult(ids, [-0.5] * len(ids), routes, FINISH_STOP, self.weight_version)]

    def load_weights(self, params_state, version):
        raise NotImplementedError


def episode(task, tok, site):
    """Returns (solved, turns, tool calls, seconds in run_agent_episode, total seconds)."""
    t0 = time.perf_counter()
    engine = ReplayEngine(tok, [render_tool_call(solve_command(task)), "Done."])
    agent_s = []

    def play(box):
        t1 = time.perf_counter()
        traj = run_agent_episode(task, engine, tok, box, EPISODE)
        agent_s.append(time.perf_counter() - t1)
        return traj

    outcome = run_trial(task, site, play)
    if outcome.error is not None:
        raise (outcome.play_error or outcome.verify_error)
    traj, report, agent_s = outcome.played, outcome.report, agent_s[0]
    return report.solved, traj.turns, traj.tool_calls, agent_s, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=16, help="episodes per concurrency level")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--tasks", type=int, default=8, help="first N bundled tasks (0: all)")
    parser.add_argument("--backend", default="docker")
    args = parser.parse_args()
    backend = make_backend(args.backend)
    tasks = [t for t in load_pool(default_pool_dir()).tasks if t.solution_script is not None]
    scale = pool_scale(tasks)
    tasks = tasks[:args.tasks] if args.tasks else tasks
    tok = train_tokenizer()
    t = time.perf_counter()
    run_id = f"bench-agent-{uuid.uuid4().hex[:8]}"
    site = TrialSite(backend, run_id=run_id, scale=scale)
    images = site.images
    if failed := images.build_all(tasks):
        raise SystemExit(f"cannot build every task: {failed}")
    print(f"built/checked {len(images.built)} images in {time.perf_counter() - t:.1f} s")
    load = os.getloadavg()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; python {platform.python_version()}; "
          f"backend {args.backend}; {len(tasks)} tasks round-robin")
    base_rate = None
    print("| concurrent sandboxes | episodes | wall (s) | episodes / min | vs 1 | solved | "
          "mean in agent loop (s) | mean episode (s) | load avg (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for level in (int(c) for c in args.concurrency.split(",")):
        jobs = [tasks[i % len(tasks)] for i in range(args.episodes)]
        t = time.perf_counter()
        results = fan_out(jobs, lambda task: episode(task, tok, site), workers=level,
                          backend=backend, run_id=run_id)
        wall = time.perf_counter() - t
        rate = len(jobs) / wall * 60
        base_rate = base_rate or rate
        solved = sum(r[0] for r in results)
        assert all(r[1] == 2 and r[2] == 1 for r in results), results
        print(f"| {level} | {len(jobs)} | {wall:.1f} | {rate:.1f} | {rate / base_rate:.2f}x | "
              f"{solved}/{len(jobs)} | {np.mean([r[3] for r in results]):.2f} | "
              f"{np.mean([r[4] for r in results]):.2f} | {os.getloadavg()[0]:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
