"""The PPO trainer (t1jax/rl/trainer.py) on a tiny MoE (2 layers, layer 0 dense, 8 experts,
top-2) over the 8 fake CPU devices: the sharded step computes what the single-device step
computes, the critic trains first and hands its pre-update values to GAE, R3 replays the
rollout's experts (and the mismatch metrics say so), the deterministic-mode claim (rollout
log-probs from the same model give a zero gap), the switches (rollout old log-probs, TIS,
minibatches, epochs, KL, entropy, load balancing) run, critic/SFT steps touch only their model,
the critic is warm-started from the actor, layers stored stacked (scan_layers) train as
per-layer ones do, and a step shape compiles once.

Compiles are the cost on a 2-core box: every compiled function here (the trainer's own, via
its module's `jax`) gets FAST_COMPILE, trainers are built once per module (three: 8 devices,
one device, one device with every switch on), and batches keep one shape (8, 64).
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from t1jax import sharding
from t1jax.model.layer_stack import stored_at
from t1jax.model.transformer import ValueModel
from t1jax.rl import critic as critic_lib
from t1jax.rl import ppo
from t1jax.rl import trainer as trainer_lib
from t1jax.rl.batch import pack
from t1jax.rl.trainer import Settings, Trainer, token_logprobs
from t1jax.rollout.sample import Sample

from test_sharding import FAST_COMPILE, tiny_config

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")

CFG = tiny_config()
LAYERS, K, E = CFG.num_hidden_layers, CFG.num_experts_per_tok, CFG.num_experts
LENGTHS = [20, 35, 60, 44, 28, 50, 38, 24]  # packs into 5 rows of 64 -> 8 rows on every mesh
SETTINGS = Settings(min_length=32, max_length=64, actor_lr=1e-3, critic_lr=1e-3, adam_eps=1e-4)


class _FastJax:
    """`jax`, except that jit compiles with FAST_COMPILE (same numerics, less LLVM time)."""

    def __getattr__(self, name):
        return getattr(jax, name)

    @staticmethod
    def jit(fun=None, **kw):
        kw.setdefault("compiler_options", FAST_COMPILE)
        return jax.jit(fun, **kw)


def fast_jit(fun, **kw):
    return jax.jit(fun, compiler_options=FAST_COMPILE, **kw)


def make_samples(seed, lengths=LENGTHS, cfg=CFG):
    """Random ids; a prompt, two assistant turns with an observation between; rollout log-probs
    on the sampled ids; random top-k routes on the MoE layer, -1 on the dense layer and on the
    last token (the rollout never ran the model on it); rewards in [0, 1]."""
    rng = np.random.RandomState(seed)
    out = []
    for i, n in enumerate(lengths):
        mask = np.zeros(n, np.int8)
        mask[n // 5: n // 2] = 1
        mask[(2 * n) // 3: n - 2] = 1
        routes = np.full((n, cfg.num_hidden_layers, K), -1, np.int32)
        for t in range(n - 1):
            for layer in range(cfg.num_hidden_layers):
                if cfg.is_moe_layer(layer):
                    routes[t, layer] = rng.choice(E, K, replace=False)
        out.append(Sample(tokens=rng.randint(0, CFG.vocab_size, n), loss_mask=mask,
                          rollout_logprobs=np.where(mask, -3 * rng.rand(n), 0.0),
                          routes=routes, reward=rng.rand(),
                          metadata={"task_id": f"task{seed}-{i}", "turns": 2}))
    return out


def packed_batch(samples, row_multiple=8):
    return pack(samples, buckets=[32, 64], num_layers=LAYERS, top_k=K, row_multiple=row_multiple)


def host(tree):
    return jax.device_get(tree)


def flat(state):
    return {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(state)}


def device_metrics(m):
    return {k: v for k, v in m.items() if not k.startswith("perf/")}


def actor_forward(trainer, params, batch, replay: bool):
    """(token log-probs, free routes) of the actor with `params`, as the trainer computes them."""
    key = ("fwd", replay)
    cache = trainer.__dict__.setdefault("_test_fns", {})
    if key not in cache:
        def fwd(params, batch):
            out = nnx.merge(trainer.actor_def, params)(
                batch.tokens, batch.positions, batch.segment_ids,
                routes=batch.routes if replay else None)
            return token_logprobs(out.logits, batch.tokens, trainer.s.temperature), \
                out.free_routes
        cache[key] = fast_jit(fwd)
    lp, free = cache[key](params, batch)
    return np.asarray(lp), np.asarray(free)


_critic_values = fast_jit(critic_lib.critic_values, static_argnums=0)


def with_(batch, **fields):
    return dataclasses.replace(batch, **{k: np.asarray(v) for k, v in fields.items()})


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_lib, "jax", _FastJax())
        mp.setattr(sharding, "jax", _FastJax())
        yield


def with_trained_head(trainer, seed=0):
    """A fresh critic's head is zero (its backbone gets no gradient on the first step); give it
    a fixed non-zero head, as after Critic Warm-Up, so one step exercises every critic weight."""
    critic = trainer.state.critic
    head = critic["value_head"]
    value = np.random.RandomState(seed).normal(0, 0.05, head.get_value().shape)
    critic["value_head"] = head.replace(jax.device_put(value.astype(np.float32),
                                                       head.get_value().sharding))
    trainer.state = dataclasses.replace(trainer.state, critic=critic)
    return trainer


@pytest.mark.slow
def test_fresh_critic_predicts_zero_everywhere():
    batch = packed_batch(make_samples(0)).batch
    trainer = Trainer(CFG, SETTINGS, sharding.make_mesh(devices=jax.devices()[:1]), seed=3)
    values = critic_lib.critic_values(trainer.critic_def, trainer.state.critic, batch)
    assert np.all(np.asarray(values) == 0.0)


@pytest.fixture(scope="module")
def first_step(fast):
    """One ppo_step from the same init on the 2x2x2 mesh and on one device, same batch."""
    batch = packed_batch(make_samples(0)).batch
    assert batch.shape == (8, 64)
    t8 = with_trained_head(Trainer(CFG, SETTINGS, sharding.make_mesh(data=2, fsdp=2, expert=2),
                                   seed=0))
    t1 = with_trained_head(Trainer(CFG, SETTINGS, sharding.make_mesh(devices=jax.devices()[:1]),
                                   seed=0))
    init8, init1 = host(t8.state), host(t1.state)
    sharded_leaves = [x.sharding for x in jax.tree.leaves(t8.state.actor)]
    m8, m1 = t8.ppo_step(batch), t1.ppo_step(batch)
    return dict(batch=batch, t8=t8, t1=t1, init8=init8, init1=init1, m8=m8, m1=m1,
                after8=host(t8.state), after1=host(t1.state), sharded_leaves=sharded_leaves)


@pytest.fixture(scope="module")
def single(first_step):
    """The one-device trainer (already one step in), for the tests that compute by hand."""
    return first_step["t1"]


# -- sharded == unsharded ------------------------------------------------------------------------


@pytest.mark.slow
def test_sharded_step_equals_single_device_step(first_step):
    f = first_step
    # same init
    for name in ("actor", "critic"):
        a, b = flat(getattr(f["init8"], name)), flat(getattr(f["init1"], name))
        assert a.keys() == b.keys()
        for path in a:
            np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))
    # params really are sharded on the 8-device mesh
    specs = [s.spec for s in f["sharded_leaves"]]
    assert any(any(ax is not None for ax in spec) for spec in specs)
    assert any("expert" in str(spec) for spec in specs)
    # same update
    for name in ("actor", "critic"):
        before = flat(getattr(f["init1"], name))
        a, b = flat(getattr(f["after8"], name)), flat(getattr(f["after1"], name))
        moved = 0
        for path in a:
            np.testing.assert_allclose(a[path], b[path], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} {path}")
            moved += int(not np.array_equal(b[path], before[path]))
        assert moved > len(a) // 2, f"{name}: the step barely moved the parameters"
    m8, m1 = device_metrics(f["m8"]), device_metrics(f["m1"])
    assert m8.keys() == m1.keys()
    for k in m8:
        assert np.isfinite(m8[k]), k
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert m8["actor/grad_norm"] > 0 and m8["critic/grad_norm"] > 0
    assert int(f["after8"].step) == int(f["after1"].step) == 1


# -- critic first, pre-update values -------------------------------------------------------------


def test_advantages_come_from_the_pre_update_critic(first_step):
    f, t = first_step, first_step["t1"]
    batch, s, m = f["batch"], t.s, f["m1"]

    def stats(critic_params):
        values = np.asarray(_critic_values(t.critic_def, critic_params, batch))
        adv, ret = ppo.gae(batch.rewards, values, batch.loss_mask, batch.trial_ids, s.gamma,
                           s.lam)
        return values, np.asarray(adv), float(ppo.explained_variance(values, ret,
                                                                     batch.loss_mask))

    values, adv, ev_pre = stats(f["init1"].critic)
    _, _, ev_post = stats(f["after1"].critic)
    mask = batch.loss_mask > 0
    assert m["critic/explained_variance"] == pytest.approx(ev_pre, rel=1e-4, abs=1e-5)
    assert abs(ev_post - ev_pre) > 1e-3  # the check can tell the two critics apart
    assert m["advantages/mean"] == pytest.approx(adv[mask].mean(), rel=1e-4, abs=1e-5)
    assert m["advantages/std"] == pytest.approx(adv[mask].std(), rel=1e-4, abs=1e-5)
    assert m["advantages/max"] == pytest.approx(adv[mask].max(), rel=1e-4, abs=1e-5)
    assert m["critic/values_mean"] == pytest.approx(values[mask].mean(), rel=1e-4, abs=1e-5)
    # gamma = lam = 1: the returns are each trial's reward
    assert m["critic/returns_mean"] == pytest.approx(_trial_return(batch)[mask].mean(),
                                                     rel=1e-5)


def _trial_return(batch):
    out = np.zeros(batch.shape, np.float32)
    for b in range(batch.shape[0]):
        for trial in set(batch.trial_ids[b].tolist()) - {0}:
            here = batch.trial_ids[b] == trial
            out[b, here] = batch.rewards[b, here].sum()
    return out


# -- R3 and the mismatch metrics -----------------------------------------------------------------


def _last_token_unrecorded(routes, placements):
    routes = routes.copy()
    for _, row, _, end in placements:
        routes[row, end - 1] = -1
    return routes


def test_r3_logprob_gap_by_hand_with_own_routes(single):
    packed = packed_batch(make_samples(1))
    params = host(single.state.actor)
    _, free = actor_forward(single, params, packed.batch, replay=False)
    assert np.all(free[:, :, 0] == -1)  # the dense layer records nothing
    batch = with_(packed.batch, routes=_last_token_unrecorded(free, packed.placements))
    logp, _ = actor_forward(single, params, batch, replay=True)
    mask = batch.loss_mask > 0
    gap = np.abs(logp - batch.rollout_logprobs)[mask]
    m = single.ppo_step(batch)
    assert m["mismatch/logprob_gap"] == pytest.approx(gap.mean(), rel=1e-5, abs=1e-6)
    assert m["mismatch/logprob_gap_max"] == pytest.approx(gap.max(), rel=1e-5, abs=1e-6)
    assert m["mismatch/routing_disagreement"] == 0.0
    valid = batch.segment_ids > 0
    recorded = np.all(batch.routes >= 0, -1) & valid[..., None]
    assert m["mismatch/routed_pairs"] == recorded.sum() > 0


def test_rollout_logprobs_from_the_same_model_give_zero_gap(single):
    """Deterministic mode: same model, same precision, same experts -> the same log-probs."""
    packed = packed_batch(make_samples(2))
    params = host(single.state.actor)
    _, free = actor_forward(single, params, packed.batch, replay=False)
    batch = with_(packed.batch, routes=_last_token_unrecorded(free, packed.placements))
    logp, _ = actor_forward(single, params, batch, replay=True)
    batch = with_(batch, rollout_logprobs=np.where(batch.loss_mask > 0, logp, 0.0))
    m = single.ppo_step(batch)
    assert m["mismatch/logprob_gap"] < 1e-5
    assert m["mismatch/logprob_gap_max"] < 1e-5
    assert abs(m["mismatch/k3_kl"]) < 1e-8
    assert m["mismatch/routing_disagreement"] == 0.0
    assert m["actor/approx_kl"] < 1e-5  # recomputed old log-probs, first minibatch: ratio 1


def test_stale_trials_are_measured_apart_from_the_mismatch(single):
    """Trials older weights sampled (Batch.stale) leave mismatch/* (same weights, T1's measure)
    and are measured under staleness/*: each gap by hand on its own tokens."""
    batch = packed_batch(make_samples(3)).batch
    logp, _ = actor_forward(single, host(single.state.actor), batch, replay=True)
    stale = np.zeros(batch.shape, np.float32)
    stale[:2] = batch.segment_ids[:2] > 0
    batch = with_(batch, stale=stale)
    m = single.ppo_step(batch)
    mask = batch.loss_mask > 0
    gap = np.abs(logp - batch.rollout_logprobs)
    fresh, old = mask & (stale == 0), mask & (stale > 0)
    assert fresh.any() and old.any()
    assert m["mismatch/logprob_gap"] == pytest.approx(gap[fresh].mean(), rel=1e-5, abs=1e-6)
    assert m["mismatch/logprob_gap_max"] == pytest.approx(gap[fresh].max(), rel=1e-5, abs=1e-6)
    assert m["mismatch/sampled_tokens"] == fresh.sum()
    assert m["staleness/logprob_gap"] == pytest.approx(gap[old].mean(), rel=1e-5, abs=1e-6)
    assert m["staleness/sampled_frac"] == pytest.approx(old.sum() / mask.sum(), rel=1e-6)


def test_update_metrics_say_how_far_and_which_way_the_step_moved(single):
    """update/kl is KL(before || after) on the batch's sampled tokens (k3, by hand from the
    forwards before and after the step); a working step raises the log-probs of tokens with a
    positive advantage and lowers the others; policy/entropy is the pre-update policy's."""
    batch = packed_batch(make_samples(6)).batch
    before, _ = actor_forward(single, host(single.state.actor), batch, replay=True)
    m = single.ppo_step(batch)
    after, _ = actor_forward(single, host(single.state.actor), batch, replay=True)
    mask = batch.loss_mask > 0
    log_ratio = (after - before)[mask]
    assert m["update/kl"] == pytest.approx(np.mean(np.expm1(log_ratio) - log_ratio),
                                           rel=1e-3, abs=1e-7)
    assert m["update/kl"] > 0
    assert m["update/logp_delta_pos"] > 0 > m["update/logp_delta_neg"]
    assert 0 < m["update/positive_frac"] < 1
    assert 0 < m["policy/entropy"] <= np.log(CFG.vocab_size)
    assert "actor/clip_frac_after_first" not in m  # one update: nothing after the first


@pytest.fixture(scope="module")
def variant(first_step):
    """Every switch on at once (one compile), built like any trainer (so with its frozen
    reference): free routing in training, TIS (with the recomputed old log-probs: TIS on top
    of a ratio against the rollout's would correct twice, which Settings refuses),
    2 minibatches x 2 epochs, KL loss, entropy and load balancing."""
    s = dataclasses.replace(SETTINGS, r3=False, tis=True, minibatches=2,
                            epochs=2, kl_loss_coef=0.1, entropy_coef=0.01,
                            load_balancing_coef=0.01)
    return Trainer(CFG, s, first_step["t1"].mesh, seed=0)


@pytest.mark.slow
def test_replay_of_other_experts(single, variant):
    """Rollout routes = the free top-k rolled by one expert (never the same set); rollout
    log-probs = the free forward's. Replay (r3=True) changes the log-probs; free routing
    (r3=False) reproduces the rollout's; both see every recorded pair disagree."""
    packed = packed_batch(make_samples(3), row_multiple=2)
    assert packed.batch.shape == (8, 64)
    params = host(single.state.actor)
    free_logp, free = actor_forward(single, params, packed.batch, replay=False)
    rolled = np.where(free >= 0, (free + 1) % E, -1).astype(np.int32)
    batch = with_(packed.batch, routes=_last_token_unrecorded(rolled, packed.placements),
                  rollout_logprobs=np.where(packed.batch.loss_mask > 0, free_logp, 0.0))
    replay_logp, _ = actor_forward(single, params, batch, replay=True)
    mask = batch.loss_mask > 0
    by_hand = np.abs(replay_logp - free_logp)[mask].mean()
    assert by_hand > 1e-3  # replaying other experts really changes the policy

    m_r3 = single.ppo_step(batch)
    assert m_r3["mismatch/routing_disagreement"] == pytest.approx(1.0)
    assert m_r3["mismatch/logprob_gap"] == pytest.approx(by_hand, rel=1e-5, abs=1e-6)

    # the variant is another trainer: its rollout batch comes from its own params
    vparams = host(variant.state.actor)
    v_free_logp, v_free = actor_forward(single, vparams, packed.batch, replay=False)
    v_rolled = np.where(v_free >= 0, (v_free + 1) % E, -1).astype(np.int32)
    vbatch = with_(packed.batch, routes=_last_token_unrecorded(v_rolled, packed.placements),
                   rollout_logprobs=np.where(mask, v_free_logp, 0.0))
    m_free = variant.ppo_step(vbatch)
    assert m_free["mismatch/routing_disagreement"] == pytest.approx(1.0)
    assert m_free["mismatch/logprob_gap"] < 1e-5
    assert m_r3["mismatch/logprob_gap"] > 100 * m_free["mismatch/logprob_gap"]


def test_switches_run_and_report(first_step, variant):
    before = flat(host(variant.state.actor))
    step = int(variant.state.step)
    packed = packed_batch(make_samples(4), row_multiple=variant.row_multiple)
    m = variant.ppo_step(packed.batch)
    for key in ("actor/kl_loss", "actor/entropy", "actor/load_balancing",
                "actor/kl_to_reference", "actor/tis_capped_frac", "actor/pg_loss",
                "actor/clip_frac", "actor/approx_kl", "critic/value_loss"):
        assert key in m and np.isfinite(m[key]), key
    assert all(np.isfinite(v) for v in device_metrics(m).values())
    assert m["actor/entropy"] > 0 and m["actor/kl_loss"] >= 0
    # 4 updates (2 minibatches x 2 epochs): the later ones see a moved policy, the first cannot
    assert m["actor/clip_frac_after_first"] >= m["actor/clip_frac"] * 4 / 3 - 1e-6
    assert m["actor/approx_kl_after_first"] > 0
    assert m["actor/load_balancing"] >= 1.0 - 1e-4  # E * sum f * p >= 1 at its minimum
    assert int(variant.state.step) == step + 1
    after = flat(host(variant.state.actor))
    assert any(not np.array_equal(before[p], after[p]) for p in before)
    assert variant.row_multiple == 2  # minibatches count in the row multiple
    # the reference stays the frozen initial actor (same seed as the first_step trainers')
    ref0, ref1 = flat(first_step["init1"].actor), flat(host(variant.state.reference))
    assert ref0.keys() == ref1.keys()
    for p in ref0:
        np.testing.assert_array_equal(ref0[p], ref1[p], err_msg=str(p))
    # the actor has moved away from it: the next step sees a positive KL (the first step of a
    # fresh trainer computes it at the reference itself, so it holds whichever test ran before)
    assert variant.ppo_step(packed.batch)["actor/kl_to_reference"] != 0.0


# -- critic_step, sft_step -----------------------------------------------------------------------


@pytest.mark.slow
def test_critic_step_trains_only_the_critic(single):
    samples = make_samples(5)
    actor0, critic0 = flat(host(single.state.actor)), flat(host(single.state.critic))
    m = single.critic_step(samples)
    actor1, critic1 = flat(host(single.state.actor)), flat(host(single.state.critic))
    for p in actor0:
        np.testing.assert_array_equal(actor0[p], actor1[p], err_msg=str(p))
    assert sum(not np.array_equal(critic0[p], critic1[p]) for p in critic0) > len(critic0) // 2
    assert np.isfinite(m["critic/value_loss"]) and "critic/explained_variance" in m
    assert m["trials"] == len(samples)


@pytest.mark.slow
def test_sft_step_lowers_nll_and_leaves_the_critic(single):
    samples = make_samples(6, lengths=[30, 40, 25, 50])
    critic0 = flat(host(single.state.critic))
    nll = [single.sft_step(samples)["sft/nll"] for _ in range(10)]
    assert nll[-1] < nll[0] - 0.05, nll
    critic1 = flat(host(single.state.critic))
    for p in critic0:
        np.testing.assert_array_equal(critic0[p], critic1[p], err_msg=str(p))
    assert len([k for k in single._compiled if k[0] == "sft"]) == 1


@pytest.mark.slow
def test_scanned_layers_train_like_unrolled_ones(fast):
    """scan_layers (the repeating layers stored stacked, one array per block position): from the
    same seed, one PPO step (critic and actor, replayed routes, clip, Adam) gives every layer's
    parameters the update the per-layer model gives them, and the same metrics."""
    cfg = CFG.replace(num_hidden_layers=3, remat=True)  # layers 1-2: one MoE block, twice
    samples = make_samples(11, cfg=cfg)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    runs = {}
    for scan in (False, True):
        trainer = with_trained_head(Trainer(cfg.replace(scan_layers=scan), SETTINGS, mesh,
                                            seed=0))
        before = host(trainer.state)
        metrics = device_metrics(trainer.ppo_step(samples))
        runs[scan] = before, host(trainer.state), metrics
    scanned_cfg = cfg.replace(scan_layers=True)
    assert any(path[1] == "blocks" for path in flat(runs[True][1].actor))
    for name in ("actor", "critic"):
        for when in (0, 1):  # the same init, then the same update
            unrolled = flat(getattr(runs[False][when], name))
            scanned = flat(getattr(runs[True][when], name))
            assert sum(v.size for v in scanned.values()) == sum(v.size for v in unrolled.values())
            for path, value in unrolled.items():
                stored, r = stored_at(scanned_cfg, path)
                got = scanned[stored] if r is None else scanned[stored][r]
                np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} {path}")
    for k, v in runs[False][2].items():
        np.testing.assert_allclose(runs[True][2][k], v, rtol=1e-4, atol=1e-6, err_msg=k)


# -- init, compile reuse -------------------------------------------------------------------------


@pytest.mark.slow
def test_critic_warm_started_from_actor():
    trainer = Trainer(CFG, SETTINGS, sharding.make_mesh(devices=jax.devices()[:1]), seed=0)
    actor, critic = flat(host(trainer.state.actor)), flat(host(trainer.state.critic))
    backbone = [p for p in critic if p[0] == "model"]
    assert backbone and len(backbone) == len([p for p in actor if p[0] == "model"])
    for p in backbone:
        np.testing.assert_array_equal(critic[p], actor[p], err_msg=str(p))
    # the value head is the ValueModel's own: zero (a fresh critic predicts 0), not copied
    heads = [p for p in critic if p[0] != "model"]
    assert sorted(heads) == [("value_bias",), ("value_head",)]
    for p in heads:
        assert not np.any(critic[p]), p
    # and the backbone was overwritten: a fresh critic's backbone differs from the actor's
    fresh = flat(nnx.split(ValueModel(CFG, nnx.Rngs(1)), nnx.Param)[1])
    assert any(not np.array_equal(fresh[p], actor[p]) for p in backbone)


def _ppo_cache_size(trainer):
    keys = [k for k in trainer._compiled if k[0] == "ppo"]
    assert keys == [("ppo", (8, 64))]  # one compiled step per (name, bucket shape)
    return trainer._compiled[keys[0]]._cache_size()


def test_same_bucket_compiles_once(single):
    """Two sample lists of other lengths that land in the same bucket shape: no new compile."""
    a = single.ppo_step(make_samples(7))
    size = _ppo_cache_size(single)
    b = single.ppo_step(make_samples(8, lengths=[n + 1 for n in LENGTHS]))
    assert a["perf/rows"] == b["perf/rows"] == 8 and a["perf/length"] == b["perf/length"] == 64
    assert _ppo_cache_size(single) == size


def test_host_batch_and_sample_list_share_one_compile(single):
    """A packed host Batch (as the tests above pass) and a sample list of the same shape should
    hit the same executable. Today they compile twice (~12 s here): `Trainer._run` hands a
    Batch to the jitted step as given (numpy, uncommitted) but a sample list as arrays already
    sharded by `shard_batch`, and jit keys its cache on that difference."""
    single.ppo_step(packed_batch(make_samples(9)).batch)
    single.ppo_step(make_samples(10))
    assert _ppo_cache_size(single) == 1


@pytest.mark.slow
def test_hybrid_qwen35_ppo_step_with_zero_gap(fast):
    """The trainer on the hybrid Qwen3.5 model (every layer MoE, linear-attention layers over
    packed rows): rollout log-probs and routes from the same weights give a zero log-prob gap
    and zero routing disagreement under R3, and one PPO step moves both the actor's linear
    attention and the critic."""
    from test_sharding import hybrid_config
    cfg = hybrid_config()
    t = with_trained_head(Trainer(cfg, SETTINGS, sharding.make_mesh(devices=jax.devices()[:1]),
                                  seed=0))
    samples = make_samples(11)
    for s in samples:  # every Qwen3.5 layer is MoE: shape the routes for 4 layers
        s.routes = np.full((len(s.tokens), cfg.num_hidden_layers, cfg.num_experts_per_tok), -1,
                           np.int32)
    packed = pack(samples, buckets=[32, 64], num_layers=cfg.num_hidden_layers,
                  top_k=cfg.num_experts_per_tok, row_multiple=8)
    before = host(t.state)
    params = before.actor
    _, free = actor_forward(t, params, packed.batch, replay=False)
    assert (free[packed.batch.segment_ids > 0] >= 0).all()  # every layer routes every token
    batch = with_(packed.batch, routes=_last_token_unrecorded(free, packed.placements))
    logp, _ = actor_forward(t, params, batch, replay=True)
    batch = with_(batch, rollout_logprobs=np.where(batch.loss_mask > 0, logp, 0.0))
    m = t.ppo_step(batch)
    assert m["mismatch/logprob_gap_max"] < 1e-5
    assert m["mismatch/routing_disagreement"] == 0.0
    assert all(np.isfinite(v) for k, v in m.items() if isinstance(v, float))
    after = host(t.state)
    moved = lambda tree, *path: not np.array_equal(  # noqa: E731
        flat(tree)[path], flat(before.actor if tree is after.actor else before.critic)[path])
    assert moved(after.actor, "model", "layers", 0, "attn", "A_log")
    assert moved(after.actor, "model", "layers", 1, "attn", "conv_k")
    assert moved(after.critic, "model", "layers", 3, "attn", "gate")


# -- long rows: the vocabulary reduced in chunks -------------------------------------------------


@pytest.mark.slow
def test_chunked_logits_step_equals_full_logits_step(first_step):
    """rl.logits_chunk below the row length: the actor never builds [rows, length, vocab] logits
    (t1jax.rl.token_stats), and the PPO step's update and metrics equal the full-logits step's;
    SFT's nll and token accuracy come from the same chunked stats."""
    f = first_step
    s = dataclasses.replace(SETTINGS, logits_chunk=16)
    chunked = with_trained_head(Trainer(CFG, s, sharding.make_mesh(devices=jax.devices()[:1]),
                                        seed=0))
    m = device_metrics(chunked.ppo_step(f["batch"]))
    full = device_metrics(f["m1"])
    assert m.keys() == full.keys()
    for k in m:
        np.testing.assert_allclose(m[k], full[k], rtol=1e-4, atol=1e-5, err_msg=k)
    after, want = flat(host(chunked.state.actor)), flat(f["after1"].actor)
    for path in want:
        np.testing.assert_allclose(after[path], want[path], rtol=1e-5, atol=1e-5,
                                   err_msg=str(path))
    sft = chunked.sft_step(make_samples(6, lengths=[30, 40, 25, 50]))
    assert np.isfinite(sft["sft/nll"]) and 0.0 <= sft["sft/token_accuracy"] <= 1.0


@pytest.mark.slow
def test_value_head_init_zeros_by_default_and_uniform_like_torch_linear_on_request():
    mesh = sharding.make_mesh(data=2, fsdp=2, expert=2)
    zeros = Trainer(CFG, SETTINGS, mesh, seed=0).state.critic
    assert not np.any(np.asarray(zeros["value_head"].get_value()))
    assert float(zeros["value_bias"].get_value()) == 0.0
    uniform = Trainer(CFG, dataclasses.replace(SETTINGS, value_head_init="uniform"), mesh,
                      seed=0).state.critic
    head = uniform["value_head"].get_value()
    bound = 1 / np.sqrt(CFG.hidden_size)
    values = np.append(np.asarray(head), float(uniform["value_bias"].get_value()))
    assert np.all(np.abs(values) <= bound) and np.std(values) > bound / 3
    assert head.sharding == zeros["value_head"].get_value().sharding  # placed like the zeros
    backbone = flat(zeros["model"])
    assert len(backbone) > 10 and all(np.array_equal(v, backbone[k])  # backbone untouched
                                      for k, v in flat(uniform["model"]).items())
    with pytest.raises(ValueError, match="value_head_init"):
        Settings.from_config({"value_head_init": "normal"})


@pytest.mark.slow
def test_a_trial_split_over_rows_gets_the_values_and_advantages_of_one_row(single):
    """A multi-chunk trial too long for a row is cut into rows of whole chunks: the real critic
    gives every sampled token the value it gets with the trial in one row (attention stays in
    the chunk, positions restart), and the linked GAE gives the same advantages."""
    long, short = make_samples(5, lengths=[100, 30])
    long = dataclasses.replace(long, chunk_starts=[0, 30, 55, 80])
    samples = [long, short]

    def run(buckets):
        packed = pack(samples, buckets=buckets, num_layers=LAYERS, top_k=K)
        b = packed.batch
        values = np.asarray(_critic_values(single.critic_def, single.state.critic, b))
        adv, _ = ppo.gae(b.rewards, values, b.loss_mask, b.trial_ids, 1.0, 0.9, b.continues_at)
        out = {}
        for (i, row, start, end), c in zip(packed.placements, packed.piece_starts):
            here = slice(start, end)
            for name, x in (("values", values), ("adv", np.asarray(adv)), ("mask", b.loss_mask)):
                out.setdefault((name, i), np.zeros(len(samples[i].tokens)))[c:c + end - start] \
                    = x[row, here]
        return packed, out

    one, a = run([128])
    split, b = run([32, 64])
    assert one.batch.shape[1] == 128 and split.batch.shape[1] == 64
    assert len({row for i, row, _, _ in split.placements if i == 0}) == 2
    for i in range(2):
        m = a["mask", i] > 0
        np.testing.assert_array_equal(b["mask", i], a["mask", i])
        assert np.abs(a["values", i][m]).max() > 1e-3  # the trained head says something
        np.testing.assert_allclose(b["values", i][m], a["values", i][m], atol=2e-5)
        np.testing.assert_allclose(b["adv", i][m], a["adv", i][m], atol=5e-5)
