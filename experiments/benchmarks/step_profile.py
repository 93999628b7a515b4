"""Where a training step's time goes: the main job's SFT and PPO steps traced with jax.profiler,
each XLA op's time attributed to a part of the model by the named scope in its HLO metadata.

  .venv/bin/python experiments/benchmarks/step_profile.py [--run runs/tiny_cpu] \
      [--steps 4]

configs/tiny_cpu.py's Trainer (its model and rl settings: the shared SFT prefix, R3, TITO) runs
`--steps` SFT steps on batches of a finished run's SFT data and `--steps` PPO steps on its
recorded PPO rollout batches (without --run: synthetic batches of the same shapes), after one
untimed step each (the compile). Printed per step kind: the median wall time, and per part
(attention scores and softmax, attention projections, MoE, dense MLP, LM head, norms, the rest:
embedding, loss, optimizer, copies) its op time per step and its share of all op time (the
baseline of the ratios). XLA runs ops on both cores at once, so op time exceeds wall time.
The parts come from `jax.named_scope`s in t1jax/model (metadata only: the compiled step and
its numbers are the same without them).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DUMP = tempfile.mkdtemp(prefix="t1jax-step-profile-")  # the optimized HLO, for op names
atexit.register(shutil.rmtree, DUMP, ignore_errors=True)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP}"
                           " --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE"
                           " --xla_dump_hlo_module_re=.*(sft|ppo)_step.*")

import jax  # noqa: E402

from configs import tiny_cpu  # noqa: E402
from experiments.benchmarks.ppo_step import machine_lines, synthetic_samples  # noqa: E402
from experiments.benchmarks.shared_prefix import main_job_like  # noqa: E402
from t1jax.jobs import build  # noqa: E402
from t1jax.rollout.sample import load_samples  # noqa: E402

# scope in the op's name stack -> part; the first that matches wins (scores inside attention)
PARTS = (("scores", "attention: scores, mask, softmax, values"),
         ("linear_attention", "linear attention"),
         ("attention", "attention: q/k/v/o projections, q/k norms, rope"),
         ("moe", "MoE: router, dispatch, experts"),
         ("mlp", "dense MLP"),
         ("lm_head", "LM head, log-probs"),
         ("norm", "RMS norms"))
REST = "the rest: embedding, loss, optimizer, copies"


def part_of(op_name: str) -> str:
    scopes = set(re.split(r"[/()]", op_name))
    return next((part for scope, part in PARTS if scope in scopes), REST)


def op_parts(module: str) -> dict[str, str]:
    """HLO op name -> part, from the optimized HLO XLA dumped for `module` (jit_sft_step)."""
    out = {}
    for path in sorted(glob.glob(f"{DUMP}/*.{module}.cpu_after_optimizations.txt")):
        for line in open(path):
            m = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = .*?op_name="([^"]*)"', line)
            if m:
                out[m.group(1)] = part_of(m.group(2))
    return out


def profile(trace_dir: str, fn, batches) -> tuple[list[float], list[dict]]:
    """Wall seconds of fn(batch) per batch (blocked until the state is ready), traced."""
    times = []
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    try:
        for batch in batches:
            t = time.perf_counter()
            fn(batch)
            times.append(time.perf_counter() - t)
    finally:
        jax.profiler.stop_trace()
    path = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
    events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    return times, [e for e in events if e.get("ph") == "X" and "hlo_module" in e.get("args", {})]


def report(kind: str, module: str, times: list[float], events: list[dict]) -> None:
    parts = op_parts(module)
    per_part: dict[str, float] = collections.Counter()
    for e in events:
        if e["args"]["hlo_module"] == module:
            per_part[parts.get(e["args"].get("hlo_op", e["name"]), REST)] += e["dur"] / 1e3
    total, steps = sum(per_part.values()), len(times)
    print(f"\n{kind} step: median {statistics.median(times):.3f} s wall over {steps} steps; "
          f"op time {total / steps:.0f} ms per step")
    print("part | op ms per step | share of op time")
    for part, ms in sorted(per_part.items(), key=lambda kv: -kv[1]):
        print(f"  {part} | {ms / steps:.1f} | {100 * ms / total:.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="", help="a finished main-job workdir (its SFT data "
                                                  "and PPO rollouts); default: synthetic")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    for line in machine_lines():
        print(line)
    config = tiny_cpu.get_config()
    trainer = build.trainer(config, build.mesh_from(config), sft_steps=config.sft.steps)
    n = config.sft.batch_size
    if args.run:
        pool = load_samples(Path(args.run) / "sft" / "sft_data")
        sft = [pool[i * n:(i + 1) * n] for i in range(args.steps + 1)]
        steps = sorted(Path(args.run, "ppo", "rollouts").glob("step_*"))[:args.steps + 1]
        ppo = [load_samples(d) for d in steps]
    else:
        vocab = config.model.vocab_size
        sft = [main_job_like(n, vocab, seed=i) for i in range(args.steps + 1)]
        ppo = [synthetic_samples(trainer.cfg, config.rollouts.batch_size, 320, turns=2, seed=i)
               for i in range(args.steps + 1)]
    print(f"batches: {'run ' + args.run if args.run else 'synthetic'}; {args.steps} traced "
          "steps per kind after one untimed (compiling) step")

    def sft_step(batch):
        trainer.sft_step(batch)
        jax.block_until_ready(trainer.state)

    def ppo_step(batch):
        trainer.ppo_step(batch)
        jax.block_until_ready(trainer.state)

    for kind, fn, batches, module in (("SFT", sft_step, sft, "jit_sft_step"),
                                      ("PPO", ppo_step, ppo, "jit_ppo_step")):
        fn(batches[0])
        with tempfile.TemporaryDirectory() as trace_dir:
            times, events = profile(trace_dir, fn, batches[1:])
        report(kind, module, times, events)


if __name__ == "__main__":
    main()
