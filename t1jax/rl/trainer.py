"""The PPO actor-critic trainer: state, optimizers and the jitted steps, sharded over the mesh.

One PPO step, as T1 runs it:
  1. the critic's pre-update values V(s) and the actor's pre-update log-probs (R3: replaying the
     rollout's expert selection) -- the mismatch metrics come from this forward;
  2. GAE from those values (so advantages and the value clip are anchored to one function);
  3. the critic trains first, then the actor (PPO clip, optional TIS, KL, entropy, aux terms).
Critic Warm-Up runs steps 1-3 for the critic alone; SFT trains the actor on masked tokens.
Every step is jitted with explicit in/out shardings over the mesh and donates the state.

One module at ~460 lines: Settings, TrainState and the pure step functions below are one unit,
each step compiled by Trainer for one Settings value and one state layout; moving the steps out
would need a third module for the two types they read. The minibatch cut and the update scan,
which need neither, are t1jax/rl/minibatch.py.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time

import jax
import numpy as np
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from t1jax import distributed, sharding
from t1jax.model.transformer import CausalLM, ValueModel, log_probs
from t1jax.rl import critic as critic_lib
from t1jax.rl import metrics as metrics_lib
from t1jax.rl import ppo
from t1jax.rl import batch as batch_lib
from t1jax.rl.batch import BASELINES, REWARDS, Batch, batch_shardings, pack, shard_batch
from t1jax.rl.minibatch import per_minibatch, train_minibatches
from t1jax.rl.shared_prefix import shared_prefix_forward, shared_prefix_length, suffix_length
from t1jax.rl.token_stats import token_stats
from t1jax.rollout.sample import bucket_lengths


@dataclasses.dataclass(frozen=True)
class Settings:
    """The rl config block as a hashable value (it parameterises the compiled steps). The one
    place its defaults are written: configs/common.py's rl_config() is made from them. PPO as
    T1 runs it: critic first, symmetric clip, Adam at a constant rate, R3 on; KL, entropy and
    load-balancing terms exist as switches and are off."""
    gamma: float = 1.0  # discount per sampled token (observations are not steps)
    lam: float = 1.0  # GAE lambda; 1.0 = Monte Carlo returns minus the critic's baseline
    clip_eps: float = 0.2  # symmetric PPO ratio clip
    value_clip: float = 0.2  # critic value clip around its pre-update values; <= 0 turns it off
    normalize_advantages: bool = True  # whiten advantages over the batch's sampled tokens
    temperature: float = 1.0  # the rollout's sampling temperature (log-probs must match it)
    actor_lr: float = 1e-6
    critic_lr: float = 5e-6
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # global-norm clip per model; <= 0 turns it off
    minibatches: int = 1  # optimizer updates per step per epoch (rows split evenly)
    epochs: int = 1  # passes over the step's batch
    r3: bool = True  # replay the rollout's expert selection in the actor's training forward
    old_logprobs: str = "recompute"  # PPO ratio vs: recompute (trainer, pre-update) | rollout
    # truncated importance sampling, min(pi_old / pi_rollout, tis_cap): with recompute, the
    # decoupled objective that one_step_off and carry-over need (rl/loop.check_off_policy_correction)
    tis: bool = True
    tis_cap: float = 2.0
    kl_loss_coef: float = 0.0  # k3 KL(pi || reference) in the loss (reference = initial actor)
    kl_reward_coef: float = 0.0  # per-token KL penalty in the reward
    entropy_coef: float = 0.0
    load_balancing_coef: float = 0.0  # MoE auxiliary loss weight (T1: 0)
    min_length: int = 64  # smallest sequence bucket; buckets double up to max_length
    max_length: int = 1024  # longest sample (a longer one is an error, or dropped: overlong)
    packing: bool = True  # several samples per row (attention kept inside each)
    overlong: str = "error"  # error | drop (counted) -- never truncated
    # dense (T1: passed assertions / the pool's fixed scale) | binary (solved) | shuffled (a
    # control: each step's rewards permuted over its trials) | zero (a control: no reward)
    reward: str = "dense"
    # none (T1: the critic is the baseline) | task: minus the mean reward of the batch's other
    # trials of the same task (leave-one-out; pair with rollouts.group_size > 1)
    baseline: str = "none"
    # keep (PPO) | drop: negative advantages zeroed after whitening, so updates only raise what
    # went better than expected (a diagnostic of docs/probes.md: do negative updates do harm?)
    negative_advantages: str = "keep"
    # rows longer than this reduce over the vocabulary in chunks of this many tokens instead of
    # materialising [rows, length, vocab] float32 logits (t1jax.rl.token_stats)
    logits_chunk: int = 4096
    value_head_init: str = "zeros"  # zeros (a fresh critic predicts 0) | uniform (nn.Linear's)
    # one more forward of the updated actor per PPO step (1 of its 9 forward-equivalents):
    # update/kl and update/logp_delta_*, how far and which way the step moved the policy
    update_metrics: bool = True
    # SFT: rows that open with the same tokens (system prompt, tool schema) run them once and
    # broadcast their keys and values (t1jax/rl/shared_prefix.py); same loss and gradients.
    # Models with linear-attention layers (Qwen3.5) and packed rows always run full rows
    share_prefix: bool = True

    @classmethod
    def from_config(cls, rl) -> "Settings":
        known = {f.name for f in dataclasses.fields(cls)}
        given = dict(rl.items()) if hasattr(rl, "items") else dict(rl)
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"unknown rl config fields {unknown}; known: {sorted(known)}")
        return cls(**given)

    def __post_init__(self):
        """Checked however the settings are made (from a config, or dataclasses.replace)."""
        if self.old_logprobs not in ("recompute", "rollout"):
            raise ValueError(f"rl.old_logprobs must be 'recompute' or 'rollout', got "
                             f"{self.old_logprobs!r}")
        if self.tis and self.old_logprobs == "rollout":
            raise ValueError(
                "rl.tis=True with rl.old_logprobs='rollout' corrects for the rollout policy "
                "twice: the PPO ratio is already taken against the rollout's log-probs, and TIS "
                "would weight it again by pi_old / pi_rollout. Set rl.tis=False, or "
                "rl.old_logprobs='recompute' (the ratio against the trainer's pre-update "
                "policy, TIS for the rollout mismatch)")
        if self.reward not in REWARDS:
            raise ValueError(f"rl.reward must be one of {REWARDS}, got {self.reward!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"rl.baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.negative_advantages not in ("keep", "drop"):
            raise ValueError(f"rl.negative_advantages must be 'keep' or 'drop', got "
                             f"{self.negative_advantages!r}")
        if self.value_head_init not in critic_lib.VALUE_HEAD_INITS:
            raise ValueError(f"rl.value_head_init must be one of {critic_lib.VALUE_HEAD_INITS}, "
                             f"got {self.value_head_init!r}")
        if self.minibatches < 1 or self.epochs < 1:
            raise ValueError("rl.minibatches and rl.epochs must be >= 1")

    @property
    def uses_reference(self) -> bool:
        return self.kl_loss_coef > 0 or self.kl_reward_coef > 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    step: jax.Array  # int32 scalar: PPO/SFT/warm-up updates applied
    actor: nnx.State
    critic: nnx.State
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    reference: nnx.State | None = None  # frozen initial actor, only when a KL term is on


LR_SCHEDULES = ("constant", "cosine")


def sft_learning_rate(lr: float, schedule: str, steps: int) -> float | optax.Schedule:
    """SFT's learning rate: `lr` throughout, or ("cosine") decayed from `lr` to 0 over `steps`.
    Why cosine: at a constant rate the weights SFT ends on are one draw from the noise of its
    last steps (two runs of the main job, constant 3e-3, ended at NLL 0.099 and 0.143, and
    their PPO phases then resolved 16% vs 3% of training trials); decaying the rate lands
    them near the bottom. PPO keeps a constant rate, as T1 does."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"sft.lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    return optax.cosine_decay_schedule(lr, steps) if schedule == "cosine" else lr


def make_optimizer(lr: float | optax.Schedule, s: Settings) -> optax.GradientTransformation:
    adam = optax.adam(lr, b1=s.adam_b1, b2=s.adam_b2, eps=s.adam_eps)
    return optax.chain(optax.clip_by_global_norm(s.max_grad_norm), adam) \
        if s.max_grad_norm > 0 else adam


def token_logprobs(logits, tokens, temperature: float):
    """log p(token t) from the logits at t-1, [B, L] (0 at t=0)."""
    lp = log_probs(logits[:, :-1], tokens[:, 1:], temperature)
    return jnp.pad(lp, ((0, 0), (1, 0)))


def init_train_state(actor_tx, critic_tx, s: Settings, actor, critic) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), actor, critic, actor_tx.init(actor),
                      critic_tx.init(critic), actor if s.uses_reference else None)


def train_state_shardings(init, actor, critic, actor_tx, critic_tx, mesh):
    """Where every leaf of `init(actor, critic)` lives: parameters where they are, optimizer
    moments like their parameters, counters replicated. Why explicit: Adam's moments are
    zeros with no operand, so left to XLA they come out replicated, a full copy of the model
    in float32 per chip (an ahead-of-time compile for v5p-64 of Qwen3-30B-A3B's init needed
    236 GB per chip that way)."""
    replicated = NamedSharding(mesh, P())
    where = lambda tree: jax.tree.map(lambda x: x.sharding, tree)  # noqa: E731
    shape = jax.eval_shape(init, actor, critic)

    def moments(tx, opt_shape, params):
        return optax.tree_map_params(tx, lambda _, p: p.sharding, opt_shape, params,
                                     transform_non_params=lambda _: replicated)
    return TrainState(replicated, where(actor), where(critic),
                      moments(actor_tx, shape.actor_opt, actor),
                      moments(critic_tx, shape.critic_opt, critic),
                      None if shape.reference is None else where(actor))


class Trainer:
    """Actor and critic, their optimizers and the compiled steps, over one mesh."""

    def __init__(self, model_cfg, rl, mesh, *, seed: int = 0, rules=None,
                 actor_lr: float | optax.Schedule | None = None):
        self.cfg, self.mesh, self.rules = model_cfg, mesh, rules
        self.s = rl if isinstance(rl, Settings) else Settings.from_config(rl)
        self.buckets = bucket_lengths(self.s.min_length, self.s.max_length)
        actor = sharding.create_sharded(lambda: CausalLM(model_cfg, nnx.Rngs(seed)), mesh, rules)
        critic = sharding.create_sharded(lambda: ValueModel(model_cfg, nnx.Rngs(seed + 1)), mesh,
                                         rules)
        self.actor_def, actor_params = nnx.split(actor, nnx.Param)
        self.critic_def, critic_params = nnx.split(critic, nnx.Param)
        critic_params = critic_lib.warm_start_from_actor(critic_params, actor_params)
        if self.s.value_head_init == "uniform":
            critic_params = critic_lib.uniform_value_head(critic_params, jax.random.key(seed + 2))
        self.actor_tx = make_optimizer(self.s.actor_lr if actor_lr is None else actor_lr, self.s)
        self.critic_tx = make_optimizer(self.s.critic_lr, self.s)
        self.state = self._init_state(actor_params, critic_params)
        self._compiled: dict = {}

    def _init_state(self, actor_params, critic_params) -> TrainState:
        init = functools.partial(init_train_state, self.actor_tx, self.critic_tx, self.s)
        out = train_state_shardings(init, actor_params, critic_params, self.actor_tx,
                                    self.critic_tx, self.mesh)
        with jax.set_mesh(self.mesh):
            return jax.jit(init, out_shardings=out)(actor_params, critic_params)

    # -- data ------------------------------------------------------------------------------------

    @property
    def row_multiple(self) -> int:
        shape = dict(self.mesh.shape)
        return shape["data"] * shape["fsdp"] * shape["expert"] * self.s.minibatches

    def make_batch(self, samples, version: int | None = None):
        """Pack and shard samples; returns (Batch on the mesh, Packed host layout). version:
        the weight version being trained (older trials are marked stale). In a multi-process
        job every process packs the same samples alike, but reads and places the routes of
        its own rows only (a step's samples carry them as distributed.SharedArray)."""
        layers, k = self.cfg.num_hidden_layers, self.cfg.num_experts_per_tok
        multi = distributed.process_count() > 1
        own_rows = (functools.partial(self._own_rows, layers=layers, k=k) if multi else None)
        packed = pack(samples, buckets=self.buckets, num_layers=layers, top_k=k,
                      row_multiple=self.row_multiple, packing=self.s.packing,
                      overlong=self.s.overlong, reward=self.s.reward,
                      baseline=self.s.baseline, version=version, routes_rows=own_rows)
        if not multi:
            return shard_batch(packed.batch, self.mesh, self.rules), packed
        batch = batch_lib.shard_packed(packed, self.mesh, self.rules)
        batch_lib.release_shared_routes(samples, packed, self.mesh, self.rules)
        return batch, packed

    def _own_rows(self, rows: int, length: int, *, layers: int, k: int) -> list[int]:
        return batch_lib.local_rows(rows, length, layers, k, self.mesh, self.rules)

    # -- compiled steps --------------------------------------------------------------------------

    def state_shardings(self):
        return jax.tree.map(lambda x: x.sharding, self.state)

    def _jit(self, name: str, fn, batch: Batch):
        key = (name, batch.tokens.shape)
        if key not in self._compiled:
            state_sh = self.state_shardings()
            step = jax.jit(
                fn, in_shardings=(state_sh, batch_shardings(batch, self.mesh, self.rules)),
                out_shardings=(state_sh, None), donate_argnums=(0,))
            if distributed.process_count() > 1:
                # compile here, then meet: processes compile at different speeds, and the
                # step's first collective gives them only 30 s to arrive (distributed.py)
                with jax.set_mesh(self.mesh):
                    step = step.lower(self.state, batch).compile()
                distributed.rendezvous(f"compiled {name}")
            self._compiled[key] = step
        return self._compiled[key]

    def _run(self, name: str, fn, samples_or_batch, version: int | None = None,
             share_prefix: bool = False):
        if isinstance(samples_or_batch, Batch):  # placed like make_batch's: one compile
            batch, packed = shard_batch(samples_or_batch, self.mesh, self.rules), None
        else:
            batch, packed = self.make_batch(samples_or_batch, version)
        prefix = suffix = 0
        if share_prefix:
            host = jax.device_get(samples_or_batch) if packed is None else packed.batch
            prefix = shared_prefix_length(host.tokens, host.positions, host.segment_ids,
                                          host.loss_mask)
            if prefix:
                suffix = suffix_length(host.segment_ids, prefix)
                fn, name = functools.partial(fn, shared=(prefix, suffix)), \
                    f"{name}@{prefix}+{suffix}"
        step = self._jit(name, fn, batch)
        t0 = time.perf_counter()
        with jax.set_mesh(self.mesh):
            self.state, metrics = step(self.state, batch)
        metrics = metrics_lib.drop_unmeasured(
            {k: float(v) for k, v in jax.device_get(metrics).items()})
        seconds = time.perf_counter() - t0
        real = float(jnp.sum(batch.segment_ids > 0))
        metrics.update({"perf/step_seconds": seconds, "perf/tokens_per_s": real / seconds,
                        "perf/padding_frac": 1.0 - real / batch.tokens.size,
                        "perf/rows": batch.tokens.shape[0], "perf/length": batch.tokens.shape[1],
                        "perf/shared_prefix": prefix})
        if packed is not None:
            metrics["batch/dropped_overlong"] = len(packed.dropped)
            pieces = collections.Counter(p[0] for p in packed.placements)
            metrics["batch/split_trials"] = sum(n > 1 for n in pieces.values())  # over rows
            trials = max(len(pieces), 1)  # what the critic and actor were given
            metrics["reward/trained_mean"] = float(np.sum(packed.batch.rewards)) / trials
        if not isinstance(samples_or_batch, Batch):
            metrics.update(metrics_lib.sample_stats(samples_or_batch))
        return metrics

    def ppo_step(self, samples_or_batch, version: int | None = None) -> dict:
        """version: the weight version being trained (the loop's step); the trials older
        weights sampled are measured under staleness/* instead of mismatch/*."""
        return self._run("ppo", functools.partial(ppo_step, self.actor_def, self.critic_def,
                                                  self.actor_tx, self.critic_tx, self.s),
                         samples_or_batch, version)

    def critic_step(self, samples_or_batch) -> dict:
        """Critic Warm-Up: the critic alone on the frozen actor's rollouts."""
        return self._run("critic", functools.partial(critic_step, self.critic_def,
                                                     self.critic_tx, self.s), samples_or_batch)

    def sft_step(self, samples_or_batch) -> dict:
        return self._run("sft", functools.partial(sft_step, self.actor_def, self.actor_tx,
                                                  self.s), samples_or_batch,
                         share_prefix=self.s.share_prefix and not self.cfg.linear_layers)

    def actor_params(self) -> nnx.State:
        """A copy of the policy's parameters. The steps donate the train state, so anything
        that outlives a step (an engine generating during training) must hold its own."""
        return jax.tree.map(jnp.copy, self.state.actor)

    def actor_model(self) -> CausalLM:
        """The current policy as a module with its own parameters (export_hf, engines)."""
        return nnx.merge(self.actor_def, self.actor_params())


# -- pure step functions (jitted by Trainer) ---------------------------------------------------

def _critic_phase(critic_def, critic_tx, s: Settings, state: TrainState, batch: Batch,
                  rewards):
    """Pre-update values, GAE, critic update. Returns (critic, opt, metrics, values, adv, ret)."""
    mask = batch.loss_mask
    old_values = jax.lax.stop_gradient(per_minibatch(
        functools.partial(critic_lib.critic_values, critic_def), state.critic, batch,
        s.minibatches))
    advantages, returns = ppo.gae(rewards, old_values, mask, batch.trial_ids, s.gamma, s.lam,
                                   batch.continues_at)
    critic, critic_opt, m = train_minibatches(
        critic_lib.critic_loss(critic_def, s.value_clip), state.critic, state.critic_opt,
        critic_tx, (batch, old_values, returns), s.minibatches, s.epochs)
    m = {k if k.startswith("critic/") else f"critic/{k}": v for k, v in m.items()}
    m["critic/explained_variance"] = ppo.explained_variance(old_values, returns, mask)
    m["critic/returns_mean"] = ppo.masked_mean(returns, mask)
    return critic, critic_opt, m, old_values, advantages, returns


def critic_step(critic_def, critic_tx, s: Settings, state: TrainState, batch: Batch):
    critic, critic_opt, m, *_ = _critic_phase(critic_def, critic_tx, s, state, batch,
                                              batch.rewards)
    return dataclasses.replace(state, step=state.step + 1, critic=critic,
                               critic_opt=critic_opt), m


def actor_forward(actor_def, params, batch: Batch, replay: bool, s: Settings,
                  temperature: float, entropy: bool = False, accuracy: bool = False,
                  shared: tuple[int, int] | None = None):
    """The policy's training forward and its per-token stats [B, L]: "logp" (0 at t=0), with
    "entropy" and "correct" (argmax hit) on request. Rows over s.logits_chunk tokens never hold
    their full logits. Public: studies of the train-inference gap score rollouts with it.
    shared=(prefix, suffix): the rows share tokens[:, :prefix] (shared_prefix_length), which
    run once; the stats are then those of tokens[:, prefix:prefix + suffix] (0 at its start)."""
    model = nnx.merge(actor_def, params)
    if shared and replay:
        raise ValueError("a shared prefix cannot replay routes (R3): rows may have recorded "
                         "different routes for the same prefix")
    tokens = batch.tokens[:, shared[0]:sum(shared)] if shared else batch.tokens
    chunked = tokens.shape[1] > s.logits_chunk
    if shared:
        out = shared_prefix_forward(model, batch.tokens, batch.positions, batch.segment_ids,
                                    *shared, logits=not chunked)
    else:
        out = model(tokens, batch.positions, batch.segment_ids,
                    routes=batch.routes if replay else None, logits=not chunked)
    if chunked:
        return out, token_stats(out.hidden, model.head(), tokens, temperature,
                                chunk=s.logits_chunk, entropy=entropy, accuracy=accuracy)
    stats = {"logp": token_logprobs(out.logits, tokens, temperature)}
    if entropy:
        stats["entropy"] = jnp.pad(ppo.entropy(out.logits[:, :-1], temperature), ((0, 0), (1, 0)))
    if accuracy:
        hit = jnp.argmax(out.logits[:, :-1], -1) == tokens[:, 1:]
        stats["correct"] = jnp.pad(hit.astype(jnp.float32), ((0, 0), (1, 0)))
    return out, stats


def _pre_update(actor_def, s: Settings, params, batch: Batch, entropy: bool = False):
    out, stats = actor_forward(actor_def, params, batch, s.r3, s, s.temperature,
                               entropy=entropy)
    return (stats["logp"], out.free_routes) + ((stats["entropy"],) if entropy else ())


def actor_update(actor_def, actor_tx, s: Settings, actor, actor_opt, batch: Batch, old_logp,
                 advantages, tis=None, ref_logp=None):
    """PPO's actor update (step 4): clipped policy loss plus the switched-on terms, over the
    minibatches. Returns (actor, optimizer state, metrics)."""
    def actor_loss(params, batch, old_logp, advantages, tis, ref_logp):
        out, stats = actor_forward(actor_def, params, batch, s.r3, s, s.temperature,
                                   entropy=s.entropy_coef > 0)
        logp = stats["logp"]
        loss, clip_frac, approx_kl = ppo.policy_loss(logp, old_logp, advantages,
                                                     batch.loss_mask, s.clip_eps, tis)
        aux = {"actor/pg_loss": loss, "actor/clip_frac": clip_frac, "actor/approx_kl": approx_kl,
               "actor/load_balancing": out.aux_loss}
        if s.kl_loss_coef > 0:
            kl = ppo.masked_mean(ppo.k3_kl(ref_logp, logp), batch.loss_mask)
            loss, aux["actor/kl_loss"] = loss + s.kl_loss_coef * kl, kl
        if s.entropy_coef > 0:
            ent = ppo.masked_mean(stats["entropy"], batch.loss_mask)
            loss, aux["actor/entropy"] = loss - s.entropy_coef * ent, ent
        if s.load_balancing_coef > 0:
            loss = loss + s.load_balancing_coef * out.aux_loss
        return loss, aux

    actor, actor_opt, m = train_minibatches(actor_loss, actor, actor_opt, actor_tx,
                                            (batch, old_logp, advantages, tis, ref_logp),
                                            s.minibatches, s.epochs)
    return actor, actor_opt, {k if k.startswith("actor/") else f"actor/{k}": v
                              for k, v in m.items()}


def actor_step(actor_def, actor_tx, s: Settings, state: TrainState, batch: Batch, advantages):
    """The actor's half of `ppo_step` given the advantages: its pre-update forward and its
    update (TIS and KL off). A PPO step runs the critic's half (`critic_step`'s work) in
    between; the ahead-of-time checks (t1jax/jobs/aot.py) compile the two halves apart, so each
    program stays small enough to compile on a laptop-sized host."""
    old_logp, _ = per_minibatch(functools.partial(_pre_update, actor_def, s), state.actor,
                                batch, s.minibatches)
    actor, actor_opt, m = actor_update(actor_def, actor_tx, s, state.actor, state.actor_opt,
                                       batch, jax.lax.stop_gradient(old_logp), advantages)
    return dataclasses.replace(state, step=state.step + 1, actor=actor, actor_opt=actor_opt), m


def ppo_step(actor_def, critic_def, actor_tx, critic_tx, s: Settings, state: TrainState,
             batch: Batch):
    mask = batch.loss_mask
    # 1. the actor before the update: the log-probs PPO's ratio and the mismatch metrics use
    pre_update = functools.partial(_pre_update, actor_def, s)
    train_logp, free_routes, entropy = per_minibatch(
        functools.partial(pre_update, entropy=True), state.actor, batch, s.minibatches)
    train_logp = jax.lax.stop_gradient(train_logp)
    # same weights (mismatch/*, T1's measure) apart from trials older weights sampled
    fresh = batch.stale == 0
    metrics = metrics_lib.mismatch(train_logp, batch.rollout_logprobs, mask * fresh,
                                   free_routes, batch.routes, (batch.segment_ids > 0) & fresh)
    metrics.update(metrics_lib.stale_mismatch(train_logp, batch.rollout_logprobs, mask,
                                              batch.stale))
    old_logp = train_logp if s.old_logprobs == "recompute" else batch.rollout_logprobs
    rewards = batch.rewards
    ref_logp = None
    if s.uses_reference:
        ref_logp, _ = per_minibatch(pre_update, state.reference, batch, s.minibatches)
        ref_logp = jax.lax.stop_gradient(ref_logp)
        kl = (train_logp - ref_logp) * mask
        metrics["actor/kl_to_reference"] = ppo.masked_mean(kl, mask)
        rewards = rewards - s.kl_reward_coef * kl
    # 2-3. critic first, on its pre-update values; the actor gets the same values' advantages
    critic, critic_opt, critic_metrics, _, advantages, _ = _critic_phase(
        critic_def, critic_tx, s, state, batch, rewards)
    metrics.update(critic_metrics)
    metrics.update({"advantages/mean": ppo.masked_mean(advantages, mask),
                    "advantages/std": jnp.sqrt(ppo.masked_var(advantages, mask)),
                    "advantages/max": jnp.max(jnp.where(mask > 0, advantages, -jnp.inf)),
                    "advantages/min": jnp.min(jnp.where(mask > 0, advantages, jnp.inf))})
    if s.normalize_advantages:
        advantages = ppo.masked_whiten(advantages, mask)
    signed = advantages  # update/logp_delta_neg still follows the would-be-negative tokens
    if s.negative_advantages == "drop":  # only what went better than expected is reinforced
        advantages = jnp.maximum(advantages, 0.0)
    tis = None
    if s.tis:
        tis = ppo.truncated_importance_weights(train_logp, batch.rollout_logprobs, s.tis_cap)
        metrics["actor/tis_capped_frac"] = ppo.masked_mean(
            (jnp.exp(train_logp - batch.rollout_logprobs) > s.tis_cap).astype(jnp.float32), mask)
    # 4. the actor
    actor, actor_opt, actor_metrics = actor_update(actor_def, actor_tx, s, state.actor,
                                                   state.actor_opt, batch, old_logp, advantages,
                                                   tis, ref_logp)
    metrics.update(actor_metrics)
    metrics["policy/entropy"] = ppo.masked_mean(entropy, mask)  # the pre-update policy's
    if s.update_metrics:
        new_logp, _ = per_minibatch(pre_update, actor, batch, s.minibatches)
        metrics.update(metrics_lib.update_movement(train_logp, new_logp, signed, mask))
    new_state = dataclasses.replace(state, step=state.step + 1, actor=actor, critic=critic,
                                    actor_opt=actor_opt, critic_opt=critic_opt)
    return new_state, metrics


def sft_step(actor_def, actor_tx, s: Settings, state: TrainState, batch: Batch,
             shared: tuple[int, int] | None = None):
    """Supervised warm start: token-mean cross-entropy on the masked (assistant) tokens.
    shared=(prefix, suffix): the rows' common prefix runs once (Trainer.sft_step finds it;
    no token of it or right after it is trained, so the loss is the full rows')."""
    def loss(params, batch):
        _, stats = actor_forward(actor_def, params, batch, False, s, 1.0, accuracy=True,
                                 shared=shared)
        mask = batch.loss_mask[:, shared[0]:sum(shared)] if shared else batch.loss_mask
        nll = ppo.masked_mean(-stats["logp"], mask)
        return nll, {"sft/nll": nll,
                     "sft/token_accuracy": ppo.masked_mean(stats["correct"][:, 1:],
                                                           mask[:, 1:])}

    actor, actor_opt, m = train_minibatches(loss, state.actor, state.actor_opt, actor_tx,
                                            (batch,), s.minibatches, s.epochs)
    m = {k if k.startswith("sft/") else f"sft/{k}": v for k, v in m.items()}
    return dataclasses.replace(state, step=state.step + 1, actor=actor, actor_opt=actor_opt), m
