"""The train-inference log-prob gap of T1's "Stable MoE RL", measured at small scale: real agent
episodes from the embedded engine at a rollout precision, scored by the training forward with
or without routing replay (R3), with the harness keeping sampled ids (TITO) or not.

Why: the T1 report gives the gap (mask-weighted mean |logp_train - logp_rollout| over trained
tokens) as 0.021 with neither TITO nor R3 and 0.013 with both, and names kernel numerics as
what R3 cannot align. This measures ours with the trainer's own metric (metrics.mismatch) on
the trainer's packing and forward, with rollout numerics differing as in production (bfloat16
inference, float32 training), and checks that equal precision in one shared model removes it.

R3 changes only the training forward, so the four TITO x R3 settings need two sets of rollouts
(TITO on and off), each scored twice: R3's effect is measured on identical trajectories.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import uuid
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t1jax.model.transformer import CausalLM
from t1jax.rl import metrics
from t1jax.rl.batch import pack
from t1jax.rl.trainer import Settings, actor_forward
from t1jax.rollout.agent import run_agent_episode
from t1jax.rollout.batching import BatchingEngine
from t1jax.rollout.engine import SeededCalls
from t1jax.rollout.fan_out import fan_out
from t1jax.rollout.jax_engine import JaxEngine
from t1jax.rollout.sample import Sample, bucket_lengths, make_sample
from t1jax.rollout.settings import EpisodeSettings
from t1jax.rollout.trial import TrialSite, run_trial
from t1jax.sandbox.base import Limits
from t1jax.curation import families
from t1jax.tasks.task import load_task

# The five rows: (setting, rollout dtype, TITO, R3).
SETTINGS = (("neither", "bfloat16", False, False),
            ("TITO only", "bfloat16", True, False),
            ("R3 only", "bfloat16", False, True),
            ("TITO + R3", "bfloat16", True, True),
            ("deterministic: float32 rollout, TITO + R3", "float32", True, True))


@dataclasses.dataclass
class Rollouts:
    """One set of finished episodes, as the trainer would receive them."""
    samples: list[Sample]
    tito: bool
    rollout_dtype: str
    turns: int  # generate calls over all episodes
    noncanonical_turns: int  # turns whose sampled ids are not the tokenizer's encoding of them


def cast_policy(policy: CausalLM, dtype: str) -> CausalLM:
    """The policy with parameters and compute in `dtype`: what an inference server in bfloat16
    holds of float32-trained weights (the same model code, another precision)."""
    cfg = dataclasses.replace(policy.model.cfg, param_dtype=dtype, compute_dtype=dtype)
    graphdef, shapes = nnx.split(nnx.eval_shape(lambda: CausalLM(cfg, nnx.Rngs(0))))
    state = jax.tree.map(lambda s, x: jnp.asarray(x, s.dtype), shapes, nnx.state(policy))
    return nnx.merge(graphdef, state)


def family_tasks(out_dir, count: int, *, seed: int = 0) -> list:
    """Up to `count` held-out combinations of the tiny recipe's generated pool for `seed` (key
    entities a policy trained on that pool never saw with the family; 12 at the recipe's
    defaults), families interleaved; written under out_dir and loaded."""
    plan = families.plan_split(seed=seed)
    by_family: dict[str, list[str]] = {}
    for tid in plan["heldout_combinations"]:
        by_family.setdefault(plan["instances"][tid][0], []).append(tid)
    order = [t for group in itertools.zip_longest(*by_family.values()) for t in group if t]
    return [load_task(families.write_task(Path(out_dir) / tid, *plan["instances"][tid]))
            for tid in order[:count]]


def load_policy(checkpoints, cfg) -> CausalLM:
    """The actor of the latest checkpoint under `checkpoints` (a t1jax run's
    <stage>/checkpoints, e.g. runs/tiny_cpu/sft/checkpoints), as a float32 CausalLM of `cfg`."""
    from t1jax.checkpoint import Checkpointer, abstract_like
    graphdef, params = nnx.split(CausalLM(cfg, nnx.Rngs(0)), nnx.Param)
    with Checkpointer.reader(checkpoints) as source:
        if source.latest_step() is None:
            raise FileNotFoundError(f"no finished checkpoint in {checkpoints}")
        actor = source.restore_items({"actor": abstract_like(params)})["actor"]
    return nnx.merge(graphdef, actor)


class _Recorder:
    """Passes generate calls through, keeping every completion's sampled ids."""

    def __init__(self, engine):
        self.engine, self.max_len = engine, engine.max_len
        self.outputs: list[list[int]] = []

    def generate(self, prompts, sampling):
        results = self.engine.generate(prompts, sampling)
        self.outputs += [list(r.output_ids) for r in results]
        return results


def collect(policy: CausalLM, tasks, tokenizer, backend, *, tito: bool,
            rollout_dtype: str = "bfloat16", episodes: int = 4, seed: int = 0,
            max_turns: int = 3, max_new_tokens: int = 48, max_tokens: int = 384,
            temperature: float = 1.0, concurrency: int = 4,
            system_prompt: str = families.SYSTEM_PROMPT, limits: Limits = Limits()) -> Rollouts:
    """Run `episodes` agent episodes (tasks round-robin, one fresh sandbox each) with the
    embedded engine holding `policy` cast to `rollout_dtype`. Episode i's calls sample with seeds
    made of (seed, task, i, call) (SeededCalls), so two calls that differ only in `tito` start
    every episode identically."""
    engine = JaxEngine(cast_policy(policy, rollout_dtype), max_batch=concurrency,
                       max_len=max_tokens, prefill_buckets=(64, 128, 256, 512, 1024))
    recorder = _Recorder(BatchingEngine(engine))
    chosen = [tasks[i % len(tasks)] for i in range(episodes)]
    # not graded (no scale); each task's image built once, cached by content
    site = TrialSite(backend, limits, run_id=f"mismatch-study-{uuid.uuid4().hex[:8]}",
                     concurrency=concurrency)

    def episode(i: int) -> Sample:
        task = chosen[i]
        episode = EpisodeSettings(temperature=temperature, max_new_tokens=max_new_tokens,
                                  max_turns=max_turns, max_tokens=max_tokens,
                                  system_prompt=system_prompt, tito=tito)
        seeded = SeededCalls(recorder, seed, task.task_id, i)  # both arms: the same draws
        outcome = run_trial(task, site, lambda box: run_agent_episode(task, seeded, tokenizer,
                                                                      box, episode))
        if outcome.play_error is not None:
            raise outcome.play_error
        traj = outcome.played
        sample = make_sample(traj, None, task.task_id, i)
        sample.metadata["retokenized_drift"] = traj.retokenized_drift
        return sample

    samples = fan_out(range(episodes), episode, workers=site.concurrency, backend=backend,
                      run_id=site.run_id, name="mismatch")
    noncanonical = sum(
        ids != tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=False),
                                add_special_tokens=False).ids for ids in recorder.outputs)
    return Rollouts(samples, tito, rollout_dtype, len(recorder.outputs), noncanonical)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _score(graphdef, params, batch, replay: bool, temperature: float):
    """The trainer's pre-update forward and mismatch metrics (trainer.ppo_step, step 1), plus
    how often the experts the forward *used* differ from the rollout's (0 under replay)."""
    out, stats = actor_forward(graphdef, params, batch, replay, Settings(), temperature)
    train_logp = stats["logp"]
    valid = batch.segment_ids > 0
    m = metrics.mismatch(train_logp, batch.rollout_logprobs, batch.loss_mask, out.free_routes,
                         batch.routes, valid)
    used = metrics.mismatch(train_logp, batch.rollout_logprobs, batch.loss_mask, out.routes,
                            batch.routes, valid)
    m["mismatch/used_route_disagreement"] = used["mismatch/routing_disagreement"]
    m["trained_tokens"] = jnp.sum(batch.loss_mask)
    return m


def score(policy: CausalLM, rollouts: Rollouts, *, r3: bool, temperature: float = 1.0) -> dict:
    """Score rollouts with `policy` as the trainer does (packed rows, one forward, replaying
    the recorded experts when r3) and return the gap and routing metrics of that batch."""
    cfg = policy.model.cfg
    longest = max(len(s.tokens) for s in rollouts.samples)
    length = 1 << max(6, math.ceil(math.log2(longest)))  # one compiled shape per power of two
    packed = pack(rollouts.samples, buckets=bucket_lengths(length, length),
                  num_layers=cfg.num_hidden_layers, top_k=cfg.num_experts_per_tok)
    graphdef, params = nnx.split(policy, nnx.Param)
    m = jax.device_get(_score(graphdef, params, packed.batch, r3, float(temperature)))
    drift = [s.metadata["retokenized_drift"] for s in rollouts.samples]
    return {
        "rollout_dtype": rollouts.rollout_dtype, "tito": rollouts.tito, "r3": r3,
        "episodes": len(rollouts.samples), "turns": rollouts.turns,
        "trained_tokens": int(m["trained_tokens"]),
        "gap_mean": float(m["mismatch/logprob_gap"]),
        "gap_max": float(m["mismatch/logprob_gap_max"]),
        "k3_kl": float(m["mismatch/k3_kl"]),
        "routing_disagreement": float(m["mismatch/routing_disagreement"]),
        "used_route_disagreement": float(m["mismatch/used_route_disagreement"]),
        "routed_pairs": int(m["mismatch/routed_pairs"]),
        "retokenized_drift": int(np.sum(drift)),
        "noncanonical_turns": rollouts.noncanonical_turns,
    }


def measure(policy: CausalLM, tasks, tokenizer, backend, *, tito: bool, r3: bool,
            rollout_dtype: str = "bfloat16", temperature: float = 1.0, **options) -> dict:
    """One setting: collect rollouts, then score them (options go to `collect`)."""
    rollouts = collect(policy, tasks, tokenizer, backend, tito=tito, rollout_dtype=rollout_dtype,
                       temperature=temperature, **options)
    return score(policy, rollouts, r3=r3, temperature=temperature)


def study(policy: CausalLM, tasks, tokenizer, backend, *, temperature: float = 1.0,
          **options) -> list[dict]:
    """The rows of SETTINGS, sharing rollouts wherever only R3 differs (options go to
    `collect`); each row also names its `setting`."""
    sets: dict[tuple[str, bool], Rollouts] = {}
    rows = []
    for setting, dtype, tito, r3 in SETTINGS:
        if (dtype, tito) not in sets:
            sets[dtype, tito] = collect(policy, tasks, tokenizer, backend, tito=tito,
                                        rollout_dtype=dtype, temperature=temperature, **options)
        rows.append({"setting": setting,
                     **score(policy, sets[dtype, tito], r3=r3, temperature=temperature)})
    return rows


COLUMNS = (("setting", "{}"), ("rollout_dtype", "{}"), ("tito", "{}"), ("r3", "{}"),
           ("gap_mean", "{:.3g}"), ("gap_max", "{:.3g}"), ("routing_disagreement", "{:.3g}"),
           ("used_route_disagreement", "{:.3g}"), ("retokenized_drift", "{}"),
           ("noncanonical_turns", "{}"), ("turns", "{}"), ("trained_tokens", "{}"))


def format_table(rows: list[dict]) -> str:
    """The rows as a plain-text table (no pandas needed)."""
    cells = [[name for name, _ in COLUMNS]]
    cells += [[fmt.format(r[name]) for name, fmt in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths)] + lines[1:])
