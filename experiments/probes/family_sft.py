"""Learnability probe: can the tiny MoE learn the generated task families by SFT, on 2 CPU cores,
through the real agent loop, sandboxes and verifier? Sizes the tiny default config.

Steps (all real pieces):
  1. write a family pool (t1jax.curation.families) and train the family tokenizer on its corpus;
  2. oracle SFT samples: every train task's solve.sh played through run_agent_episode in a
     Docker sandbox with the short system prompt, kept when the verifier says solved
     (t1jax.rollout.oracle_data.oracle_samples);
  3. evaluate the random-init policy, then SFT the tiny model (Trainer.sft_step, fixed [B, L]
     rows so nothing recompiles) and evaluate at the given steps, greedy and sampled, on the
     held-out tasks: JaxEngine over trainer.actor_model() -> run_agent_episode -> verify.
Writes `<out>/results.jsonl` (one line per evaluation) and prints a table.

  .venv/bin/python experiments/probes/family_sft.py --out runs/probe_family_sft \
      [--steps 100,200,400] [--lr 2e-3] [--batch 16] [--eval_tasks 20] [--temps 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path


import jax  # noqa: E402
import numpy as np  # noqa: E402

from t1jax import sharding  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.rl.trainer import Trainer  # noqa: E402
from t1jax.rollout import agent as agent_lib  # noqa: E402
from t1jax.rollout import oracle_data  # noqa: E402
from t1jax.rollout.chat import render_prefix  # noqa: E402
from t1jax.rollout.fan_out import Images, fan_out  # noqa: E402
from t1jax.rollout.jax_engine import JaxEngine  # noqa: E402
from t1jax.rollout.sample import load_samples, save_samples  # noqa: E402
from t1jax.rollout.settings import EpisodeSettings  # noqa: E402
from t1jax.rollout.tokenizer import train_tokenizer  # noqa: E402
from t1jax.rollout.trial import TrialSite, run_trial  # noqa: E402
from t1jax.curation import families  # noqa: E402
from t1jax.tasks.pool import load_pool  # noqa: E402
from t1jax.verify.reward import INVARIANT, pool_scale  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def tiny_model_config():
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny", ROOT / "configs/model/tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return model_config_from(mod.get_config().model)


def load_rl(args):
    import importlib.util
    spec = importlib.util.spec_from_file_location("common", ROOT / "configs/common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rl = mod.rl_config()
    rl.actor_lr = args.lr
    rl.packing = False  # one sample per row: every step has the same [batch, max_len] shape
    rl.min_length = args.max_len
    rl.max_length = args.max_len
    return rl


def episode(task, engine, tok, site, settings):
    t0 = time.monotonic()
    outcome = run_trial(task, site, lambda box: agent_lib.run_agent_episode(
        task, engine, tok, box, settings))
    if outcome.error is not None:
        raise (outcome.play_error or outcome.verify_error)
    traj, report, t1 = outcome.played, outcome.report, t0 + outcome.play_s
    cmds = [c.command for r in traj.records for c in r.commands]
    goal = sum(a.status == "passed" and not INVARIANT.search(a.name) for a in report.assertions)
    goals = sum(not INVARIANT.search(a.name) for a in report.assertions)
    return {"task_id": task.task_id, "solved": bool(report.solved), "reward": report.reward,
            "goal_passed": goal, "goal_total": goals,
            "passed": report.passed, "total": report.total, "turns": traj.turns,
            "finish": traj.finish, "commands": cmds[:3], "agent_s": t1 - t0,
            "total_s": time.monotonic() - t0}


def evaluate(tasks, engine, tok, site, args, temperature):
    t0 = time.monotonic()
    settings = EpisodeSettings(temperature=temperature, max_new_tokens=args.max_new_tokens,
                               max_turns=args.max_turns, max_tokens=args.max_len,
                               system_prompt=args.system_prompt)
    rows = fan_out(tasks, lambda task: episode(task, engine, tok, site, settings),
                   workers=site.concurrency, backend=site.backend, run_id=site.run_id)
    wall = time.monotonic() - t0
    by_family = {}
    for r in rows:
        fam = r["task_id"].split("-")[0]
        by_family.setdefault(fam, []).append(r["solved"])
    return {"temperature": temperature, "resolved": float(np.mean([r["solved"] for r in rows])),
            "mean_reward": float(np.mean([r["reward"] for r in rows])),
            "mean_passed_frac": float(np.mean([r["passed"] / max(r["total"], 1) for r in rows])),
            "mean_goal_frac": float(np.mean([r["goal_passed"] / max(r["goal_total"], 1)
                                             for r in rows])),
            "by_family": {k: f"{sum(v)}/{len(v)}" for k, v in sorted(by_family.items())},
            "eval_wall_s": wall, "episode_s": float(np.mean([r["total_s"] for r in rows])),
            "examples": [(r["task_id"], r["commands"][:1], r["passed"], r["total"])
                         for r in rows[:6]], "episodes": rows}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/probe_family_sft")
    p.add_argument("--pool_dir", default=None, help="default: <out>/pool (written if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train_per_family", type=int, default=12)
    p.add_argument("--heldout_per_family", type=int, default=4)
    p.add_argument("--families", default="")
    p.add_argument("--steps", default="100,200,400")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max_len", type=int, default=384)
    p.add_argument("--max_new_tokens", type=int, default=48)
    p.add_argument("--max_turns", type=int, default=3)
    p.add_argument("--eval_tasks", type=int, default=20)
    p.add_argument("--temps", default="0,1")
    p.add_argument("--base_temps", default="0", help="temperatures for the random-init policy")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--system_prompt", default=families.SYSTEM_PROMPT)
    p.add_argument("--tokenizer", default="family", choices=["family", "default"])
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "results.jsonl", "a")
    fams = [f for f in args.families.split(",") if f] or None

    def emit(rec):
        rec["time"] = time.strftime("%H:%M:%S")
        log.write(json.dumps(rec, default=str) + "\n")
        log.flush()
        short = {k: v for k, v in rec.items() if k not in ("episodes",)}
        print(json.dumps(short, default=str), flush=True)

    t_start = time.monotonic()
    load1 = os.getloadavg()
    pool_dir = Path(args.pool_dir or out / "pool")
    if not (pool_dir / "split.json").exists():
        families.write_family_pool(pool_dir, seed=args.seed,
                                   train_per_family=args.train_per_family,
                                   heldout_per_family=args.heldout_per_family, families=fams)
    train = load_pool(pool_dir / "train").tasks
    heldout = load_pool(pool_dir / "heldout").tasks
    rng = random.Random(args.seed)
    eval_tasks = sorted(heldout, key=lambda t: t.task_id)
    rng.shuffle(eval_tasks)
    eval_tasks = eval_tasks[:args.eval_tasks]
    tok = (train_tokenizer(512, corpus=families.family_corpus(pool_dir))
           if args.tokenizer == "family" else train_tokenizer(512))
    prompt_lens = [len(tok.encode(render_prefix(args.system_prompt, t.instruction),
                                  add_special_tokens=False).ids) for t in train]
    scale = pool_scale(train + heldout)

    from t1jax.sandbox.docker_backend import DockerBackend
    backend = DockerBackend()
    t0 = time.monotonic()
    image = backend.build(train[0])  # every generated task shares this environment
    images = Images(backend, {t.task_id: image for t in train + heldout})
    site = TrialSite(backend, run_id="probe-eval", scale=scale, concurrency=args.workers,
                     images=images)
    build_s = time.monotonic() - t0

    cfg = tiny_model_config()
    t0 = time.monotonic()
    cache = out / "sft_samples"
    if cache.is_dir() and any(cache.glob("*.npz")):  # same pool + tokenizer: reuse
        samples, skipped = load_samples(cache), []
    else:
        samples, skipped = oracle_data.oracle_samples(
            train, site.with_(run_id="probe-sft-oracle"), tok,
            num_layers=cfg.num_hidden_layers, top_k=cfg.num_experts_per_tok,
            episode=EpisodeSettings(max_tokens=args.max_len, system_prompt=args.system_prompt),
            teacher=oracle_data.Teacher(final_answer=families.FINAL_ANSWER))
        save_samples(samples, cache)
    oracle_s = time.monotonic() - t0
    lens = [len(s.tokens) for s in samples]
    sampled = [int(np.sum(s.loss_mask)) for s in samples]
    emit({"phase": "setup", "args": vars(args), "train_tasks": len(train),
          "heldout_tasks": len(heldout), "eval_tasks": len(eval_tasks),
          "prompt_tokens_mean": float(np.mean(prompt_lens)), "prompt_tokens_max": max(prompt_lens),
          "sample_tokens_mean": float(np.mean(lens)), "sample_tokens_max": max(lens),
          "assistant_tokens_mean": float(np.mean(sampled)), "sft_samples": len(samples),
          "skipped": skipped[:5], "image_build_s": build_s, "oracle_samples_s": oracle_s,
          "load_avg": load1, "scale": scale.value})
    if not samples:
        raise SystemExit("no SFT samples")

    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    trainer = Trainer(cfg, load_rl(args), mesh, seed=args.seed)
    engine = JaxEngine(trainer.actor_model(), max_batch=4, max_len=args.max_len,
                       prefill_buckets=(args.max_len,), weight_version="0")
    temps = [float(t) for t in args.temps.split(",") if t]
    base_temps = [float(t) for t in args.base_temps.split(",") if t]

    for temp in base_temps:
        res = evaluate(eval_tasks, engine, tok, site, args, temp)
        emit({"phase": "eval", "sft_steps": 0, "train_s": 0.0, "load_avg": os.getloadavg(),
              **res})

    steps = sorted(int(s) for s in args.steps.split(",") if s)
    done, train_s, step_times, last = 0, 0.0, [], {}
    order = np.random.default_rng(args.seed)
    for target in steps:
        while done < target:
            idx = order.choice(len(samples), size=args.batch, replace=len(samples) < args.batch)
            t0 = time.perf_counter()
            last = trainer.sft_step([samples[i] for i in idx])
            dt = time.perf_counter() - t0
            step_times.append(dt)
            train_s += dt
            done += 1
            if done % 25 == 0 or done == 1:
                print(f"step {done}: nll {last['sft/nll']:.3f} acc "
                      f"{last['sft/token_accuracy']:.3f} {dt:.2f}s", flush=True)
        engine.load_weights(trainer.actor_params(), str(done))
        for temp in temps:
            res = evaluate(eval_tasks, engine, tok, site, args, temp)
            emit({"phase": "eval", "sft_steps": done, "train_s": train_s,
                  "step_s_median": float(np.median(step_times[1:] or step_times)),
                  "first_step_s": step_times[0], "nll": last["sft/nll"],
                  "token_accuracy": last["sft/token_accuracy"], "load_avg": os.getloadavg(),
                  "wall_s": time.monotonic() - t_start, **res})


if __name__ == "__main__":
    main()
