"""PPO learns from reward alone, by a margin luck cannot reach (issue #27, item 2).

Why: every other trainer test checks a piece (GAE, the clip, R3's replay, sharding) or that a
step runs; none shows that the whole pipeline -- engine samples, Sample routes and log-probs,
packing, critic, whitened advantages, the PPO update, publishing the new weights -- moves the
policy towards what is rewarded. A sign error on that path (advantages, log-ratio, loss) need
not turn any of them red; it turns this one red.

The task: four fixed prompts of four ids; the policy answers with two sampled ids, and the
reward is 1 when the first is in a target set, else 0. The target set is the initial policy's
most likely first answer ids (mean over prompts), taken until their mass reaches 0.3, so the
initial success rate is ~30% and the optimal policy is known (all mass on the set). Success is
measured exactly, not by sampling: the mass the policy puts on the set at the first answer
position, one forward pass, averaged over the prompts. Only the training draws are random, and
they are seeded (engine seed per trial, trainer seed 0): the test is deterministic.

Everything is the real thing, no mocks: the tiny Qwen3-MoE (test_sharding.tiny_config: layer 0
dense, layer 1 top-2 of 8 experts), the embedded JaxEngine as the recipe builds it, Samples
with the engine's routes (the last token's row -1: the model never ran on it), Trainer.ppo_step
with the default critic, the new actor published to the engine after every step as
LiveRollouts.publish does. 16 steps of 32 trials (4 prompts x 8 attempts), actor lr 3e-3.

Variants, each over seeds 0-3:
  normal            success must rise;
  flipped sign      trained on reward 1 - r, whose whitened advantages are exactly the negated
                    ones (see `collect`): success must fall, and fails the normal assertion;
  r3=False          free routing in the trainer: success must still rise. The rollouts come
                    from the weights being trained (sync), so the replayed experts are the ones
                    the router picks anyway (mismatch/routing_disagreement is 0) and the gains
                    equal the normal ones: this setting cannot see R3 at all. The R3 tests
                    (below) make the rollout's routes differ from the trainer's.
TITO (token-in, token-out across turns) has no meaning here: one turn, no text is re-encoded.

Measured (16 steps; gain = final - initial success, initial 0.3015; seeds 0-7):
  normal    +0.284 +0.259 +0.218 +0.241 +0.280 +0.230 +0.248 +0.287  mean +0.256, std 0.026
  flipped   -0.106 -0.149 -0.128 -0.106 -0.115 -0.136 -0.156 -0.121  mean -0.127, std 0.019
  r3=False  equal to normal (seeds 0-3 run here: the same four numbers)
  no signal -0.033 -0.035 -0.036 -0.031 -0.026 -0.029 -0.039 -0.031  mean -0.033, std 0.004
"No signal" (measured offline, not run here) is the normal run with rewards drawn at random
(p = 0.3) whatever the answer: PPO's updates then drift the policy off the initial one, and
the target set, being the initial most likely ids, loses a little mass. That is what luck
gives. The bar, for every seed: gain > max(MIN_GAIN, 4 x the std of the gains across seeds).
MIN_GAIN = 0.15 is 45 no-signal stds above the no-signal drift, 6 seed-to-seed stds above zero,
and 4 below the measured mean (the worst of 8 seeds, +0.218, clears it by 0.07), so a working
trainer clears it with room and chance cannot; the flipped gains (all < 0) fail it, as
`test_flipped_advantage_sign_lowers_it` asserts. (The fall is slower than the rise: the drift
above pulls both down, and success moves on a sigmoid that flattens towards 0.)

R3, rollout routing replay (issue #47, item 7). With a sync engine nothing above depends on R3,
and without a load-balancing term the bandit's router sends every token of every trial to one
expert pair within ~7 steps, after which no replay, right or wrong, changes anything. So the R3
tests change two things, from the same initial policy and target set:
  - the engine's router is offset by fixed noise (NoisyRouterEngine: ROUTER_NOISE = 0.3 x the
    router's std, drawn once per seed, added at every publish), as another inference stack's
    numerics or a stale router would be; everything else is the trained weights;
  - rl.load_balancing_coef = 0.01 (NOISY_SETTINGS) keeps the router from collapsing.
Then 48-73% of the recorded (token, MoE layer) routes differ from the trainer's own top-2 (run
mean of mismatch/routing_disagreement, replayed runs, seeds 0-15), and what R3 exists to
guarantee is measured inside the learning run, at every PPO step, by ppo_step's mismatch
metrics: the trainer's pre-update log-probs against the rollout's on the sampled tokens.
Variants: replayed (R3 as built); r3=False; shifted (token t replays the experts recorded for
token t-1); other trials' (every trial replays a trial of the next prompt). Measured (run means
over the 16 steps; seeds 0-3, then the range over seeds 0-15 (replayed, r3=False) or 0-7):
  mismatch/logprob_gap x1e4   replayed      1.1   0.6   1.5   1.8   range  0.6 .. 2.3
                              r3=False     35.0  26.2  29.4  30.4   range 15.3 .. 35.2
                              shifted      17.9  28.9  27.4  28.0   range 17.9 .. 38.7
                              other trials 20.1  48.5  30.7  39.3   range 20.1 .. 59.2
  mismatch/k3_kl x1e7         replayed     0.17  0.05  0.28  0.60   range 0.05 .. 0.97
                              r3=False      198    98   112   146   range   46 .. 212
                              shifted        53   139   111   128   range   53 .. 228
                              other trials   80   238   132   159   range   80 .. 496
  gain                        replayed   +0.274 +0.287 +0.249 +0.248  range +0.214 .. +0.294
                              r3=False   +0.257 +0.264 +0.268 +0.278  range +0.203 .. +0.302
                              shifted    +0.257 +0.267 +0.265 +0.272  range +0.222 .. +0.272
                              other      +0.286 +0.242 +0.252 +0.242  range +0.217 .. +0.286
The gains do not separate: the PPO ratio is taken against the trainer's own recomputed log-probs
under the same (wrong) experts, and wrong experts at the one MoE layer move a sampled token's
log-prob by 0.002-0.006 nats on average (TIS weights ~1), which learning absorbs. So the
assertion reads the mismatch (replay_holds): run-mean gap < GAP_BOUND = 6e-4 and run-mean k3 <
K3_BOUND = 6e-7, 2.6x and 6.2x above the worst correct run of 16, 2.6x and 7.7x below the least
broken one. test_r3_keeps_the_trainer_on_the_rollout_policy asserts it on seeds 0-3, with the
routes really differing (disagreement > 0.25) and the bandit learned (clears_the_bar); run with
any broken variant instead, it fails at replay_holds (checked for all three).
test_wrong_or_no_replay_fails_it checks that each broken variant breaks both bounds (seeds 0-1),
so the setting keeps seeing R3. What remains under correct replay is the gate weights: R3 fixes
which experts run, but the trainer weighs them with its own router, the rollout with its noisy
one.
A bf16 rollout (the engine at compute_dtype bfloat16, the trainer f32) was measured and not
used: the tiny router's logits are rarely near a tie, so only 1-3% of the routes differ (0-0.4%
without the load-balancing term), and bf16's own numeric gap (replayed: run-mean k3 ~4e-7, gap
~7e-4) swamps what R3 removes (R3 off: k3 5-7e-7, gap 7.4-7.6e-4; seeds 0-3).

Cost: three compiles dominate (trainer init, ppo step per Settings, engine prefill and decode);
one Trainer per Settings is reset to its initial state for every seed and batches keep one shape
(16 rows of 16), so each step compiles once. 1-3 s per 16-step run on 2 cores; the R3 tests
share the engine (the noise changes weights, not shapes) and add two Settings (R3 on and off
with the load-balancing term).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t1jax import sharding
from t1jax.rl.trainer import Settings, Trainer
from t1jax.rollout.batching import embedded_engine
from t1jax.rollout.engine import SamplingParams
from t1jax.rollout.sample import Sample

from test_sharding import FAST_COMPILE, tiny_config
from test_trainer import fast  # noqa: F401 (fixture: the trainer compiles with FAST_COMPILE)

pytestmark = pytest.mark.slow

CFG = tiny_config()
PROMPTS = np.random.RandomState(0).randint(0, CFG.vocab_size, (4, 4)).tolist()
ATTEMPTS = 8  # per prompt and step
TRIALS = len(PROMPTS) * ATTEMPTS
ANSWER_TOKENS = 2  # the reward reads the first; the second is trained on the same return
STEPS = 16
SEEDS = (0, 1, 2, 3)
TARGET_MASS = 0.3
SETTINGS = Settings(gamma=1.0, lam=1.0, actor_lr=3e-3, min_length=16, max_length=32)
MIN_GAIN = 0.15
# The R3 tests (module docstring): the engine's router offset by noise of this x its std, the
# load-balancing term keeping the bandit's router from collapsing, and the bounds on the
# run-mean mismatch that correct replay meets and every broken one exceeds.
ROUTER_NOISE = 0.3
NOISY_SETTINGS = dataclasses.replace(SETTINGS, load_balancing_coef=0.01)
GAP_BOUND = 6e-4  # mean mismatch/logprob_gap (nats per sampled token)
K3_BOUND = 6e-7  # mean mismatch/k3_kl
MIN_DISAGREEMENT = 0.25  # mean mismatch/routing_disagreement: the routes must really differ
BROKEN_SEEDS = SEEDS[:2]


@functools.partial(jax.jit, static_argnums=0, compiler_options=FAST_COMPILE)
def answer_distribution(actor_def, actor_params):
    """The policy's distribution of the first answer id, [prompts, vocab]."""
    logits = nnx.merge(actor_def, actor_params)(jnp.asarray(PROMPTS)).logits[:, -1]
    return jax.nn.softmax(logits / SETTINGS.temperature, axis=-1)


def target_tokens(probs) -> np.ndarray:
    """The most likely first answer ids (mean over prompts) until their mass reaches
    TARGET_MASS."""
    mean = np.asarray(probs).mean(0)
    order = np.argsort(-mean)
    return order[:int(np.searchsorted(np.cumsum(mean[order]), TARGET_MASS)) + 1]


def to_sample(prompt, result, reward: float, task_id: str, attempt: int, version: int):
    tokens = list(prompt) + list(result.output_ids)
    sampled = np.arange(len(tokens)) >= len(prompt)
    logprobs = np.zeros(len(tokens), np.float32)
    logprobs[sampled] = result.output_logprobs
    # the engine's routes cover every position but the last (never run); that row stays -1
    routes = np.full((len(tokens), CFG.num_hidden_layers, CFG.num_experts_per_tok), -1,
                     np.int32)
    routes[:len(tokens) - 1] = result.routed_experts
    return Sample(tokens, sampled, logprobs, routes, reward,
                  {"task_id": task_id, "attempt": attempt, "weight_versions": [str(version)]})


class Learner:
    """A Trainer and the engine it publishes to, rerun from the same initial policy per seed
    (one compile of the step for all runs)."""

    def __init__(self, settings: Settings, engine=None):
        self.trainer = Trainer(CFG, settings, sharding.make_mesh(devices=jax.devices()[:1]),
                               seed=0)
        self.initial = jax.tree.map(jnp.copy, self.trainer.state)  # steps donate the state
        self.engine = engine or embedded_engine(self.trainer.actor_model(), max_batch=TRIALS,
                                                max_len=settings.max_length)
        self.target = target_tokens(self.distribution())
        self.initial_success = self.success()

    def distribution(self):
        return answer_distribution(self.trainer.actor_def, self.trainer.state.actor)

    def success(self) -> float:
        """Exact: the mass on the target set at the first answer position, mean over prompts."""
        return float(np.asarray(self.distribution())[:, self.target].sum(-1).mean())

    def collect(self, seed: int, step: int, flip: bool, engine=None) -> list[Sample]:
        """One step's trials. flip trains on 1 - r: with gamma = lam = 1 a token's advantage is
        its trial's return minus V, and whitening removes the constant 1, so the advantages are
        exactly -whiten(r) while the critic predicts 0 (its start), and nearly so while it stays
        near it (with the default critic_lr, |critic/values_mean| < 0.003 over a run;
        test_flipped_advantage_sign_lowers_it checks < 0.01)."""
        prompts = [p for p in PROMPTS for _ in range(ATTEMPTS)]
        first = (seed * STEPS + step) * TRIALS  # every trial of every run its own seed
        sampling = [SamplingParams(temperature=SETTINGS.temperature,
                                   max_new_tokens=ANSWER_TOKENS, seed=first + i)
                    for i in range(TRIALS)]
        target = set(self.target.tolist())
        samples = []
        results = (engine or self.engine).generate(prompts, sampling)
        for i, (prompt, result) in enumerate(zip(prompts, results)):
            hit = float(result.output_ids[0] in target)
            samples.append(to_sample(prompt, result, 1.0 - hit if flip else hit,
                                     f"prompt{i // ATTEMPTS}", i, step))
        return samples

    def run(self, seed: int, flip: bool = False, engine=None, routes=None):
        """STEPS PPO steps from the initial policy; returns (success gain, the steps' metrics).
        engine: what samples and is published to, if not self.engine (NoisyRouterEngine);
        routes: applied to every step's Samples before the step (the R3 tests' broken
        replays)."""
        engine = engine or self.engine
        self.trainer.state = jax.tree.map(jnp.copy, self.initial)
        engine.load_weights(self.trainer.actor_params(), "0")
        history = []
        for step in range(STEPS):
            samples = self.collect(seed, step, flip, engine)
            if routes is not None:
                samples = routes(samples)
            history.append(self.trainer.ppo_step(samples, version=step))
            engine.load_weights(self.trainer.actor_params(), str(step + 1))  # publish
        return self.success() - self.initial_success, history


def clears_the_bar(gains) -> bool:
    """Every seed gains more than MIN_GAIN and 4 x the seed-to-seed std."""
    return min(gains) > max(MIN_GAIN, 4 * float(np.std(gains, ddof=1)))


@pytest.fixture(scope="module")
def replayed(fast):  # noqa: F811
    return Learner(SETTINGS)


@pytest.fixture(scope="module")
def free_routing(replayed):
    """r3=False, same initial policy and target set; shares the engine (and its compiles)."""
    return Learner(dataclasses.replace(SETTINGS, r3=False), engine=replayed.engine)


def test_initial_policy_succeeds_a_third_of_the_time(replayed):
    assert 0.2 <= replayed.initial_success <= 0.4, replayed.initial_success


def test_ppo_raises_the_success_rate(replayed):
    runs = [replayed.run(seed) for seed in SEEDS]
    gains = [g for g, _ in runs]
    print("normal gains", np.round(gains, 3))
    assert clears_the_bar(gains), gains
    # the engine sampled with the weights trained on: log-probs and routes agree
    for _, history in runs:
        assert all(abs(m["mismatch/logprob_gap"]) < 1e-4 for m in history)
        assert all(m["mismatch/routing_disagreement"] == 0 for m in history)


def test_flipped_advantage_sign_lowers_it(replayed):
    runs = [replayed.run(seed, flip=True) for seed in SEEDS]
    gains = [g for g, _ in runs]
    print("flipped gains", np.round(gains, 3))
    assert max(gains) < 0, gains
    assert not clears_the_bar(gains)  # the normal test would catch a flipped sign
    # 1 - r is the negated advantage only while V stays ~0 (Learner.collect)
    assert all(abs(m["critic/values_mean"]) < 0.01 for _, h in runs for m in h)


def test_free_routing_learns_too(free_routing, replayed):
    assert (free_routing.target == replayed.target).all()  # same seed, same initial policy
    gains = [free_routing.run(seed)[0] for seed in SEEDS]
    print("r3=False gains", np.round(gains, 3))
    assert clears_the_bar(gains), gains


def test_dropped_negative_advantages_learn_and_move_nothing_down(replayed):
    """rl.negative_advantages='drop' (the diagnostic of docs/probes.md): only better-than-
    expected tokens are pushed, and the bandit is still learned."""
    learner = Learner(dataclasses.replace(SETTINGS, negative_advantages="drop"),
                      engine=replayed.engine)
    runs = [learner.run(seed) for seed in SEEDS]
    gains = [g for g, _ in runs]
    print("drop-negative gains", np.round(gains, 3))
    assert clears_the_bar(gains), gains
    assert all(np.isfinite(m["update/logp_delta_neg"]) for _, h in runs for m in h)
    with pytest.raises(ValueError, match="negative_advantages"):
        dataclasses.replace(SETTINGS, negative_advantages="flip")


# -- R3 where the rollout's routes differ from the trainer's (issue #47, item 7) -------------------


class NoisyRouterEngine:
    """The bandit's engine, publishing the weights with every MoE router offset by fixed noise
    (ROUTER_NOISE x the router's std, drawn once per seed): a rollout whose router disagrees
    with the trainer's, as another inference stack's numerics or a stale router would. Only the
    router is changed: where both pick the same experts they compute the same function, up to
    the gate weights (the trainer's own router weighs the replayed experts, by design of R3)."""

    def __init__(self, engine, seed: int):
        self.engine, self.seed = engine, seed

    def generate(self, prompts, sampling):
        return self.engine.generate(prompts, sampling)

    def load_weights(self, params, version: str) -> None:
        params = jax.tree.map(lambda x: x, params)  # fresh Variables: the caller's stay as they are
        routers = [v for path, v in nnx.to_flat_state(params) if path[-1] == "router"]
        assert routers, "no MoE router in the published weights"
        rng = np.random.RandomState(self.seed)
        for v in routers:
            w = v.get_value()
            noise = rng.standard_normal(w.shape).astype(np.float32)
            v.set_value(w + ROUTER_NOISE * jnp.std(w) * noise)
        self.engine.load_weights(params, version)


def shifted_routes(samples):
    """Off by one position: token t replays the experts recorded for token t - 1 (token 0 none,
    so its own router picks)."""
    for s in samples:
        s.routes = np.concatenate([np.full_like(s.routes[:1], -1), s.routes[:-1]])
    return samples


def other_trials_routes(samples):
    """Every trial replays a trial of the next prompt (the step's routes rolled by ATTEMPTS over
    its trials; all have one length, prompt + ANSWER_TOKENS)."""
    routes = [s.routes for s in samples]
    assert len({r.shape for r in routes}) == 1
    for i, s in enumerate(samples):
        s.routes = routes[(i + ATTEMPTS) % len(samples)]
    return samples


MEASURED = ("mismatch/logprob_gap", "mismatch/k3_kl", "mismatch/routing_disagreement")


def noisy_run(learner: Learner, seed: int, routes=None):
    """A learning run sampled by the noisy-router engine; returns (gain, {metric: its mean over
    the run's steps} for MEASURED)."""
    gain, history = learner.run(seed, engine=NoisyRouterEngine(learner.engine, seed),
                                routes=routes)
    return gain, {k: float(np.mean([m[k] for m in history])) for k in MEASURED}


def replay_holds(means) -> bool:
    """What R3 is for: the trainer's pre-update log-probs of the sampled tokens stay those of
    the rollout, over the run (mean log-prob gap and k3 KL per step, averaged over the steps)."""
    return means["mismatch/logprob_gap"] < GAP_BOUND and means["mismatch/k3_kl"] < K3_BOUND


@pytest.fixture(scope="module")
def noisy_replayed(replayed):
    """R3 on, with the load-balancing term (NOISY_SETTINGS); shares the bandit's engine."""
    return Learner(NOISY_SETTINGS, engine=replayed.engine)


@pytest.fixture(scope="module")
def noisy_free(noisy_replayed):
    return Learner(dataclasses.replace(NOISY_SETTINGS, r3=False), engine=noisy_replayed.engine)


def test_r3_keeps_the_trainer_on_the_rollout_policy(noisy_replayed, replayed):
    assert (noisy_replayed.target == replayed.target).all()  # same initial policy
    runs = [noisy_run(noisy_replayed, seed) for seed in SEEDS]
    for (gain, means), seed in zip(runs, SEEDS):
        print(f"R3, noisy router, seed {seed}: gain {gain:+.3f}",
              {k: f"{v:.3g}" for k, v in means.items()})
    # the rollout's experts really differ from those the trainer's router picks
    assert all(m["mismatch/routing_disagreement"] > MIN_DISAGREEMENT for _, m in runs), runs
    assert all(replay_holds(m) for _, m in runs), runs
    assert clears_the_bar([g for g, _ in runs]), runs  # and the bandit is learned


BROKEN_REPLAYS = {"shifted": (shifted_routes, True), "other_trials": (other_trials_routes, True),
                  "r3_off": (None, False)}


@pytest.mark.parametrize("broken", list(BROKEN_REPLAYS))
def test_wrong_or_no_replay_fails_it(broken, noisy_replayed, noisy_free):
    """Each broken replay breaks both bounds of replay_holds on every seed of BROKEN_SEEDS (so
    test_r3_keeps_the_trainer_on_the_rollout_policy would fail with it). Its gains are printed,
    not asserted: they are as large as correct replay's (module docstring)."""
    routes, r3 = BROKEN_REPLAYS[broken]
    learner = noisy_replayed if r3 else noisy_free
    runs = [noisy_run(learner, seed, routes) for seed in BROKEN_SEEDS]
    for (gain, means), seed in zip(runs, BROKEN_SEEDS):
        print(f"{broken}, noisy router, seed {seed}: gain {gain:+.3f}",
              {k: f"{v:.3g}" for k, v in means.items()})
    assert all(m["mismatch/logprob_gap"] > GAP_BOUND and m["mismatch/k3_kl"] > K3_BOUND
               for _, m in runs), runs
    assert not any(replay_holds(m) for _, m in runs)
