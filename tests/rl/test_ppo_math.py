"""PPO's math (t1jax/rl/ppo.py) against plain numpy references, the packer (t1jax/rl/batch.py)
and the rl Settings: no model, fast.

GAE's reference is the textbook recursion run over each trial's sampled tokens in order
(observations are not MDP steps), with V after a trial's last action = 0."""

import dataclasses
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.common import rl_config
from t1jax.rl import ppo
from t1jax.rl.batch import OverlongSample, pack
from t1jax.rl.trainer import Settings
from t1jax.rollout.sample import Sample, bucket_lengths

# -- GAE ---------------------------------------------------------------------------------------


def gae_reference(rewards, values, mask, trial_ids, gamma, lam):
    """Per row, per trial: compress the sampled tokens and run textbook GAE over them."""
    adv = np.zeros_like(values, np.float64)
    for b in range(rewards.shape[0]):
        for trial in np.unique(trial_ids[b]):
            if trial == 0:
                continue
            idx = np.flatnonzero((trial_ids[b] == trial) & (mask[b] > 0))
            r, v = rewards[b, idx].astype(np.float64), values[b, idx].astype(np.float64)
            next_v = np.append(v[1:], 0.0)
            delta = r + gamma * next_v - v
            a, acc = np.zeros(len(idx)), 0.0
            for i in reversed(range(len(idx))):
                acc = delta[i] + gamma * lam * acc
                a[i] = acc
            adv[b, idx] = a
    returns = (adv + values) * (mask > 0)
    return adv, returns


def random_gae_inputs(seed, rows=3, length=48, dense_rewards=True):
    """Rows of several trials (each: prompt, assistant turns, observation gaps), then padding."""
    rng = np.random.RandomState(seed)
    mask = np.zeros((rows, length), np.float32)
    trial_ids = np.zeros((rows, length), np.int32)
    rewards = np.zeros((rows, length), np.float32)
    for b in range(rows):
        pos, trial = 0, 1
        while pos < length - 8:
            n = rng.randint(4, 16)
            n = min(n, length - 4 - pos)
            trial_ids[b, pos:pos + n] = trial
            m = (rng.rand(n) < 0.6).astype(np.float32)  # runs of 0 = observation gaps
            m[:2] = 0  # prompt
            if trial % 3 == 0:
                m[:] = 0  # a trial with nothing sampled
            mask[b, pos:pos + n] = m
            sampled = np.flatnonzero(m)
            if len(sampled):
                if dense_rewards:
                    rewards[b, pos + sampled] = rng.randn(len(sampled)) * 0.1
                rewards[b, pos + sampled[-1]] += rng.rand()  # the trial's reward
            pos, trial = pos + n, trial + 1
        # the rest of the row is padding: trial id 0, mask 0
    values = rng.randn(rows, length).astype(np.float32)
    return rewards, values, mask, trial_ids


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 1.0), (1.0, 0.8),
                                       (0.5, 0.0)])
@pytest.mark.parametrize("dense", [True, False])
def test_gae_matches_numpy_reference(gamma, lam, dense):
    for seed in range(3):
        rewards, values, mask, trial_ids = random_gae_inputs(seed, dense_rewards=dense)
        adv, ret = ppo.gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask),
                           jnp.asarray(trial_ids), gamma, lam)
        ref_adv, ref_ret = gae_reference(rewards, values, mask, trial_ids, gamma, lam)
        np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(ret), ref_ret, rtol=1e-5, atol=1e-5)
        assert np.all(np.asarray(adv)[mask == 0] == 0) and np.all(np.asarray(ret)[mask == 0] == 0)


def test_gae_gamma_lambda_one_is_return_minus_value():
    rewards, values, mask, trial_ids = random_gae_inputs(7, dense_rewards=False)
    adv, ret = ppo.gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask),
                       jnp.asarray(trial_ids), 1.0, 1.0)
    adv, ret = np.asarray(adv), np.asarray(ret)
    for b in range(rewards.shape[0]):
        for trial in set(trial_ids[b].tolist()) - {0}:
            idx = np.flatnonzero((trial_ids[b] == trial) & (mask[b] > 0))
            total = rewards[b, trial_ids[b] == trial].sum()  # the trial's reward R
            np.testing.assert_allclose(adv[b, idx], total - values[b, idx], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(ret[b, idx], total, rtol=1e-5, atol=1e-5)


def test_gae_no_credit_between_adjacent_trials():
    """Two trials back to back in a row: the second's reward never reaches the first."""
    mask = np.array([[0, 1, 1, 0, 1, 1]], np.float32)
    trial_ids = np.array([[1, 1, 1, 2, 2, 2]], np.int32)
    rewards = np.array([[0, 0, 0, 0, 0, 5.0]], np.float32)
    values = np.zeros_like(rewards)
    adv, _ = ppo.gae(rewards, values, mask, trial_ids, 1.0, 1.0)
    np.testing.assert_array_equal(np.asarray(adv), [[0, 0, 0, 0, 5, 5]])


# -- policy and value losses -------------------------------------------------------------------


def policy_loss_reference(logp, old_logp, adv, mask, eps, tis=None):
    ratio = np.exp(logp - old_logp)
    unclipped, clipped = -adv * ratio, -adv * np.clip(ratio, 1 - eps, 1 + eps)
    per = np.maximum(unclipped, clipped) * (1.0 if tis is None else tis)
    n = max(mask.sum(), 1.0)
    return ((per * mask).sum() / n, ((clipped > unclipped) * mask).sum() / n,
            (0.5 * (logp - old_logp) ** 2 * mask).sum() / n)


def policy_inputs(seed=0, shape=(4, 32)):
    rng = np.random.RandomState(seed)
    old = -rng.rand(*shape).astype(np.float32) * 3
    logp = (old + rng.randn(*shape) * 0.3).astype(np.float32)
    adv = rng.randn(*shape).astype(np.float32)
    mask = (rng.rand(*shape) < 0.7).astype(np.float32)
    return logp, old, adv, mask


@pytest.mark.parametrize("eps", [0.1, 0.2])
@pytest.mark.parametrize("with_tis", [False, True])
def test_policy_loss_matches_numpy(eps, with_tis):
    logp, old, adv, mask = policy_inputs()
    tis = np.random.RandomState(3).rand(*logp.shape).astype(np.float32) * 2 if with_tis else None
    got = ppo.policy_loss(logp, old, adv, mask, eps, None if tis is None else jnp.asarray(tis))
    ref = policy_loss_reference(logp, old, adv, mask, eps, tis)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(float(g), r, rtol=1e-5, atol=1e-6)
    assert 0 < float(got[1]) < 1  # some tokens clipped, some not


def test_policy_loss_gradient_zero_where_clipped_on_the_wrong_side():
    eps = 0.2
    logp, old, adv, mask = policy_inputs(seed=1)
    mask[:] = 1.0
    grad = np.asarray(jax.grad(lambda lp: ppo.policy_loss(lp, old, adv, mask, eps)[0])(logp))
    ratio = np.exp(logp - old)
    wrong = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    right = ~wrong
    assert wrong.sum() > 5 and right.sum() > 5
    np.testing.assert_array_equal(grad[wrong], 0.0)
    # elsewhere: d/dlogp of -A * ratio / N
    np.testing.assert_allclose(grad[right], (-adv * ratio / mask.sum())[right], rtol=1e-5,
                               atol=1e-7)
    # TIS weights scale the gradient but carry none themselves
    tis = np.full_like(logp, 0.5)
    g_tis = jax.grad(lambda lp, w: ppo.policy_loss(lp, old, adv, mask, eps, w)[0],
                     argnums=(0, 1))(logp, tis)
    np.testing.assert_allclose(np.asarray(g_tis[0]), 0.5 * grad, rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(g_tis[1]), 0.0)


def test_policy_loss_mask_excludes_tokens():
    logp, old, adv, mask = policy_inputs(seed=2)
    garbage = np.where(mask > 0, logp, 50.0).astype(np.float32)
    a = ppo.policy_loss(logp, old, adv, mask, 0.2)
    b = ppo.policy_loss(garbage, old, adv, mask, 0.2)
    for x, y in zip(a, b):
        np.testing.assert_allclose(float(x), float(y), rtol=1e-6)


@pytest.mark.parametrize("clip", [0.0, -1.0, 0.2, 0.5])
def test_value_loss_matches_numpy(clip):
    rng = np.random.RandomState(0)
    v, old, ret = (rng.randn(3, 20).astype(np.float32) for _ in range(3))
    mask = (rng.rand(3, 20) < 0.6).astype(np.float32)
    loss, frac = ppo.value_loss(v, old, ret, mask, clip)
    un = (v - ret) ** 2
    if clip <= 0:
        ref, ref_frac = 0.5 * (un * mask).sum() / mask.sum(), 0.0
    else:
        cl = (old + np.clip(v - old, -clip, clip) - ret) ** 2
        ref = 0.5 * (np.maximum(un, cl) * mask).sum() / mask.sum()
        ref_frac = ((cl > un) * mask).sum() / mask.sum()
        assert ref_frac > 0
    np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
    np.testing.assert_allclose(float(frac), ref_frac, rtol=1e-6)


def test_truncated_importance_weights_cap():
    old = np.array([-1.0, -1.0, -1.0, -5.0], np.float32)
    roll = np.array([-1.0, -2.0, -0.5, -1.0], np.float32)
    w = np.asarray(ppo.truncated_importance_weights(old, roll, 2.0))
    np.testing.assert_allclose(w, [1.0, 2.0, np.exp(-0.5), np.exp(-4.0)], rtol=1e-6)
    assert w.max() <= 2.0


# -- KL, entropy, explained variance, whitening -------------------------------------------------


def test_k3_nonnegative_and_zero_at_equality():
    rng = np.random.RandomState(0)
    a, b = rng.randn(1000).astype(np.float32) * 2, rng.randn(1000).astype(np.float32) * 2
    assert np.all(np.asarray(ppo.k3_kl(a, b)) >= 0)
    np.testing.assert_array_equal(np.asarray(ppo.k3_kl(a, a)), 0.0)


@pytest.mark.parametrize("scale", [0.05, 0.3])
def test_k3_estimates_kl_of_the_sampling_distribution(scale):
    """Samples x ~ q: mean k3(log p(x), log q(x)) -> KL(q || p), an exact sum over categories."""
    rng = np.random.RandomState(1)
    for _ in range(3):
        zq = rng.randn(16)
        zp = zq + scale * rng.randn(16)
        logq = zq - np.log(np.exp(zq).sum())
        logp = zp - np.log(np.exp(zp).sum())
        exact = np.sum(np.exp(logq) * (logq - logp))
        x = rng.choice(16, size=400_000, p=np.exp(logq) / np.exp(logq).sum())
        est = float(jnp.mean(ppo.k3_kl(logp[x].astype(np.float32), logq[x].astype(np.float32))))
        np.testing.assert_allclose(est, exact, rtol=0.05, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_matches_numpy(temperature):
    logits = np.random.RandomState(0).randn(3, 5, 11).astype(np.float32) * 3
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = -(p * np.log(p)).sum(-1)
    np.testing.assert_allclose(np.asarray(ppo.entropy(jnp.asarray(logits), temperature)), ref,
                               rtol=1e-5, atol=1e-6)
    uniform = ppo.entropy(jnp.zeros((7,)), 1.0)
    np.testing.assert_allclose(float(uniform), np.log(7), rtol=1e-6)


def test_explained_variance():
    rng = np.random.RandomState(0)
    ret = rng.randn(4, 16).astype(np.float32)
    mask = (rng.rand(4, 16) < 0.5).astype(np.float32)
    off = np.where(mask > 0, 0.0, 100.0 * rng.randn(4, 16)).astype(np.float32)
    assert float(ppo.explained_variance(ret + off, ret, mask)) == pytest.approx(1.0, abs=1e-6)
    const = np.full_like(ret, 3.0) + off
    assert float(ppo.explained_variance(const, ret, mask)) == pytest.approx(0.0, abs=1e-5)
    v = ret + 0.5 * rng.randn(4, 16).astype(np.float32)
    m = mask > 0
    ref = 1 - np.var(ret[m] - v[m]) / np.var(ret[m])
    assert float(ppo.explained_variance(v + off * 0 + np.where(m, 0, 9.0), ret, mask)) == \
        pytest.approx(ref, rel=1e-4)
    worse = -ret  # anti-correlated: below 0
    assert float(ppo.explained_variance(worse, ret, mask)) < 0


def test_masked_whiten():
    rng = np.random.RandomState(0)
    x = (rng.randn(4, 16) * 3 + 2).astype(np.float32)
    mask = (rng.rand(4, 16) < 0.5).astype(np.float32)
    w = np.asarray(ppo.masked_whiten(x, mask))
    m = mask > 0
    assert np.all(w[~m] == 0)
    np.testing.assert_allclose(w[m].mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(w[m].std(), 1.0, rtol=1e-4)
    np.testing.assert_allclose(w[m], (x[m] - x[m].mean()) / x[m].std(), rtol=1e-4, atol=1e-5)


# -- pack ----------------------------------------------------------------------------------------

LAYERS, K = 3, 2


def make_sample(n, seed, *, chunk_starts=None, reward=None, task="t", routes_shape=None):
    rng = np.random.RandomState(seed)
    mask = np.zeros(n, np.int8)
    mask[n // 4: n // 2] = 1  # assistant turn 1
    mask[(3 * n) // 4: n] = 1  # assistant turn 2 ends the sample
    if chunk_starts is not None:
        for c in chunk_starts[1:]:
            mask[c] = 1  # a chunk's first token sampled: cannot be predicted inside the chunk
    routes = rng.randint(0, 8, (n,) + (routes_shape or (LAYERS, K))).astype(np.int32)
    return Sample(tokens=rng.randint(1, 100, n), loss_mask=mask,
                  rollout_logprobs=np.where(mask, -rng.rand(n), 0.0), routes=routes,
                  reward=0.25 + 0.5 * rng.rand() if reward is None else reward,
                  metadata={"task_id": f"{task}{seed}", "attempt": 0},
                  chunk_starts=chunk_starts)


def do_pack(samples, buckets=(16, 32, 64), **kw):
    return pack(samples, buckets=list(buckets), num_layers=LAYERS, top_k=K, **kw)


def expected_mask(s):
    mask = s.loss_mask.astype(np.float32).copy()
    mask[s.chunk_starts] = 0
    return mask


def test_bucket_lengths():
    assert bucket_lengths(32, 256) == [32, 64, 128, 256]
    assert bucket_lengths(32, 100) == [32, 64, 100]
    assert bucket_lengths(64, 64) == [64]


def test_pack_round_trip_and_layout():
    lengths = [20, 9, 30, 12, 7, 25, 16]
    chunks = {2: [0, 11, 20], 5: [0, 13]}
    samples = [make_sample(n, i, chunk_starts=chunks.get(i)) for i, n in enumerate(lengths)]
    packed = do_pack(samples)
    b = packed.batch
    rows, length = b.shape
    assert length == 32
    assert sorted(p[0] for p in packed.placements) == list(range(len(samples)))
    assert packed.dropped == []
    assert len({p[1] for p in packed.placements}) < len(samples)  # really packed
    covered = np.zeros((rows, length), bool)
    for i, row, start, end in packed.placements:
        s = samples[i]
        assert end - start == len(s.tokens)
        assert not covered[row, start:end].any()
        covered[row, start:end] = True
        np.testing.assert_array_equal(b.tokens[row, start:end], s.tokens)
        np.testing.assert_array_equal(b.routes[row, start:end], s.routes)
        np.testing.assert_array_equal(b.rollout_logprobs[row, start:end], s.rollout_logprobs)
        np.testing.assert_array_equal(b.loss_mask[row, start:end], expected_mask(s))
        # positions restart at every chunk, one segment id per chunk, one trial id throughout
        bounds = list(s.chunk_starts) + [len(s.tokens)]
        segs = []
        for c0, c1 in zip(bounds[:-1], bounds[1:]):
            np.testing.assert_array_equal(b.positions[row, start + c0:start + c1],
                                          np.arange(c1 - c0))
            seg = b.segment_ids[row, start + c0:start + c1]
            assert seg[0] > 0 and np.all(seg == seg[0])
            segs.append(seg[0])
        assert len(set(segs)) == len(segs)
        trial = b.trial_ids[row, start:end]
        assert trial[0] > 0 and np.all(trial == trial[0])
        # the reward once, on the last sampled token (in the last chunk)
        r = b.rewards[row, start:end]
        last = np.flatnonzero(expected_mask(s))[-1]
        assert last >= s.chunk_starts[-1]
        np.testing.assert_array_equal(np.flatnonzero(r), [last])
        assert r[last] == np.float32(s.reward)
    # ids distinct within a row across samples
    for row in range(rows):
        here = [p for p in packed.placements if p[1] == row]
        seg_sets = [set(b.segment_ids[row, p[2]:p[3]].tolist()) for p in here]
        trials = [b.trial_ids[row, p[2]] for p in here]
        assert len(set(trials)) == len(trials)
        flat = [x for ss in seg_sets for x in ss]
        assert len(set(flat)) == len(flat)
    # padding: segment 0 (attention-irrelevant), trial 0, no loss, no reward, routes -1
    pad = ~covered
    assert pad.any()
    assert np.all(b.segment_ids[pad] == 0) and np.all(b.trial_ids[pad] == 0)
    assert np.all(b.loss_mask[pad] == 0) and np.all(b.rewards[pad] == 0)
    assert np.all(b.tokens[pad] == 0) and np.all(b.routes[pad] == -1)
    # chunk-first tokens that were sampled: zeroed and counted (2 in sample 2, 1 in sample 5)
    assert packed.fixed_chunk_starts == 3
    dtypes = dict(tokens=np.int32, positions=np.int32, segment_ids=np.int32,
                  trial_ids=np.int32, loss_mask=np.float32, rollout_logprobs=np.float32,
                  routes=np.int32, rewards=np.float32)
    for name, dt in dtypes.items():
        assert getattr(b, name).dtype == dt, name
    assert b.routes.shape == (rows, length, LAYERS, K)


def test_pack_first_token_of_single_chunk_is_counted():
    s = make_sample(10, 0)
    s.loss_mask[0] = 1
    packed = do_pack([s])
    assert packed.fixed_chunk_starts == 1
    assert packed.batch.loss_mask[0, 0] == 0


def test_pack_zero_reward_trial_has_no_reward_and_empty_mask_trial_none():
    s0 = make_sample(10, 0, reward=0.0)
    s1 = make_sample(10, 1)
    s1.loss_mask[:] = 0
    packed = do_pack([s0, s1])
    assert np.all(packed.batch.rewards == 0)


def test_pack_binary_reward_is_the_verifier_outcome_dense_is_the_sample_reward():
    solved, unsolved = make_sample(12, 0, reward=0.8), make_sample(12, 1, reward=0.4)
    solved.metadata["verifier"] = {"solved": True}
    unsolved.metadata["verifier"] = {"solved": False}
    for reward, want in (("dense", [0.8, 0.4]), ("binary", [1.0, 0.0]), ("zero", [0.0, 0.0])):
        packed = do_pack([solved, unsolved], packing=False, reward=reward)
        got = [packed.batch.rewards[row].sum() for _, row, _, _ in sorted(packed.placements)]
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert np.count_nonzero(packed.batch.rewards) == np.count_nonzero(want)
    with pytest.raises(ValueError, match="reward must be one of"):
        do_pack([solved], reward="sparse")


def test_pack_shuffled_rewards_permute_the_batch_rewards_repeatably():
    """The control: the same multiset of rewards on the same last sampled tokens, moved to
    other trials, the same way on a rerun."""
    samples = [make_sample(12, i, reward=r) for i, r in enumerate((0.1, 0.2, 0.3, 0.4, 0.5, 0.6))]

    def rewards(reward):
        packed = do_pack(samples, packing=False, reward=reward)
        return [float(packed.batch.rewards[row].sum()) for _, row, _, _ in
                sorted(packed.placements)], packed
    dense, dense_packed = rewards("dense")
    shuffled, shuffled_packed = rewards("shuffled")
    assert sorted(shuffled) == pytest.approx(sorted(dense)) and shuffled != dense
    assert shuffled == rewards("shuffled")[0]
    np.testing.assert_array_equal(dense_packed.batch.rewards != 0,
                                  shuffled_packed.batch.rewards != 0)


def test_pack_task_baseline_is_leave_one_out_per_task():
    """rl.baseline='task': each trial's reward minus the mean of its task's other trials in the
    batch (a task tried once: minus the mean of all others), on the trained reward."""
    rewards = {("a", 0): 1.0, ("a", 1): 0.0, ("a", 2): 0.5, ("b", 3): 0.25, ("b", 4): 0.75,
               ("c", 5): 0.5}
    samples = []
    for (task, i), r in rewards.items():
        samples.append(make_sample(12, i, reward=r))
        samples[-1].metadata["task_id"] = task
    packed = do_pack(samples, packing=False, baseline="task")
    got = {samples[i].metadata["task_id"] + str(i): float(packed.batch.rewards[row].sum())
           for i, row, _, _ in sorted(packed.placements)}
    others_of_c = np.mean([1.0, 0.0, 0.5, 0.25, 0.75])
    assert got == pytest.approx({"a0": 1.0 - 0.25, "a1": 0.0 - 0.75, "a2": 0.5 - 0.5,
                                 "b3": 0.25 - 0.75, "b4": 0.75 - 0.25, "c5": 0.5 - others_of_c})
    # a task whose trials all score alike teaches nothing
    same = [make_sample(12, i, reward=0.5) for i in range(3)]
    for s in same:
        s.metadata["task_id"] = "t"
    assert not np.any(do_pack(same, packing=False, baseline="task").batch.rewards)
    with pytest.raises(ValueError, match="baseline must be one of"):
        do_pack(same, baseline="critic")


@pytest.mark.parametrize("multiple", [1, 2, 3, 4])
@pytest.mark.parametrize("count", [1, 2, 3, 5, 7, 9])
def test_pack_rows_rounded_to_multiple_times_power_of_two(multiple, count):
    samples = [make_sample(20, i) for i in range(count)]
    packed = do_pack(samples, buckets=(32,), row_multiple=multiple)  # 20 + 20 > 32: one per row
    rows = packed.batch.shape[0]
    need = -(-count // multiple)
    power = 1
    while power < need:
        power *= 2
    assert rows == multiple * power
    assert rows >= count and rows % multiple == 0


@pytest.mark.parametrize("longest,bucket", [(5, 16), (16, 16), (17, 32), (32, 32), (33, 64),
                                            (64, 64)])
def test_pack_picks_smallest_fitting_bucket(longest, bucket):
    samples = [make_sample(longest, 0), make_sample(4, 1)]
    assert do_pack(samples).batch.shape[1] == bucket


def test_pack_overlong_raises_naming_the_task():
    samples = [make_sample(20, 0), make_sample(65, 1, task="overlong-task-")]
    with pytest.raises(OverlongSample, match="overlong-task-1") as err:
        do_pack(samples)
    assert "65" in str(err.value)


def test_pack_overlong_drop_lists_it_and_keeps_the_rest_whole():
    samples = [make_sample(20, 0), make_sample(65, 1), make_sample(30, 2)]
    packed = do_pack(samples, overlong="drop")
    assert [i for i, _ in packed.dropped] == [1]
    assert "t1" in packed.dropped[0][1]
    assert sorted(p[0] for p in packed.placements) == [0, 2]
    for i, row, start, end in packed.placements:
        np.testing.assert_array_equal(packed.batch.tokens[row, start:end], samples[i].tokens)
    with pytest.raises(ValueError, match="overlong"):
        do_pack([make_sample(65, 0)], overlong="drop")
    with pytest.raises(ValueError):
        do_pack(samples, overlong="truncate")


def test_pack_without_packing_one_sample_per_row():
    samples = [make_sample(n, i) for i, n in enumerate([5, 6, 7, 8])]
    packed = do_pack(samples, packing=False)
    rows = [p[1] for p in packed.placements]
    assert len(set(rows)) == len(rows) == 4
    assert all(p[2] == 0 for p in packed.placements)
    assert do_pack(samples, packing=True).batch.shape[0] == 2  # 8+7 | 6+5 in 16


def test_pack_route_shape_mismatch_raises():
    with pytest.raises(ValueError, match="routes"):
        do_pack([make_sample(10, 0, routes_shape=(LAYERS, K + 1))])
    with pytest.raises(ValueError, match="routes"):
        do_pack([make_sample(10, 0, routes_shape=(LAYERS + 1, K))])


class CountingRoutes(np.ndarray):
    """Routes that remember whether pack read them (as a SharedArray fetches on first use)."""

    def __getitem__(self, index):
        CountingRoutes.read_by.add(self.name)
        return np.asarray(self)[index]


def test_pack_with_routes_rows_fills_and_reads_only_those_rows():
    """A process's own rows (routes_rows): every other field as the full pack's, routes
    equal to the full pack's rows it names, in its order; samples placed elsewhere unread."""
    samples = [make_sample(n, seed) for seed, n in enumerate([30, 12, 9, 25, 14, 7])]
    full = do_pack(samples, row_multiple=4)
    rows = full.batch.tokens.shape[0]
    asked = []

    def own(n_rows, length):
        asked.append((n_rows, length))
        return [3, 1]
    CountingRoutes.read_by = set()
    for i, s in enumerate(samples):
        s.routes = s.routes.view(CountingRoutes)
        s.routes.name = i
    part = do_pack(samples, row_multiple=4, routes_rows=own)
    assert asked == [(rows, full.batch.tokens.shape[1])] and part.routes_rows == [3, 1]
    for field in dataclasses.fields(full.batch):
        if field.name != "routes":
            np.testing.assert_array_equal(getattr(part.batch, field.name),
                                          getattr(full.batch, field.name))
    np.testing.assert_array_equal(part.batch.routes, full.batch.routes[[3, 1]])
    in_own = {i for i, row, _, _ in full.placements if row in (1, 3)}
    assert in_own and CountingRoutes.read_by == in_own != set(range(len(samples)))


def test_pack_marks_the_trials_older_weights_sampled():
    """Batch.stale: 1 on every token of a trial with a turn sampled by weights older than the
    version trained (one-step-off, carry-over); versions that are not step numbers count as
    current; without a version nothing is stale."""
    versions = [["3", "3"], ["2", "3"], ["oracle"], None, ["4"]]
    samples = [make_sample(20, i) for i in range(len(versions))]
    for s, v in zip(samples, versions):
        s.metadata["weight_versions"] = v
    packed = do_pack(samples, version=3, packing=False)
    stale = {i: packed.batch.stale[row, start:end] for i, row, start, end in packed.placements}
    assert [bool(stale[i].all()) for i in range(5)] == [False, True, False, False, False]
    assert not any(stale[i].any() for i in (0, 2, 3, 4))
    assert packed.batch.stale.sum() == 20  # padding is never stale
    assert not do_pack(samples).batch.stale.any()


def test_unmeasured_gaps_are_left_out_not_zero():
    """mismatch/* on the trials the trained weights sampled, staleness/* on the others: a gap
    with no tokens behind it is NaN on device and absent from the step's metrics (0 would read
    as a perfect match); a NaN with tokens behind it stays."""
    from t1jax.rl import metrics
    rng = np.random.RandomState(0)
    train, rollout = -rng.rand(2, 8).astype(np.float32), -rng.rand(2, 8).astype(np.float32)
    mask = np.ones((2, 8), np.float32)
    routes = np.full((2, 8, 1, 2), -1, np.int32)
    for stale in (np.zeros_like(mask), np.ones_like(mask), np.array([[0.0] * 8, [1.0] * 8])):
        fresh = mask * (1 - stale)
        m = {**metrics.mismatch(train, rollout, fresh, routes, routes, fresh > 0),
             **metrics.stale_mismatch(train, rollout, mask, stale)}
        m = metrics.drop_unmeasured({k: float(v) for k, v in m.items()})
        gap = np.abs(train - rollout)
        assert ("mismatch/logprob_gap" in m) == bool(fresh.any())
        assert ("staleness/logprob_gap" in m) == bool(stale.any())
        if fresh.any():
            assert m["mismatch/logprob_gap"] == pytest.approx(gap[fresh > 0].mean(), rel=1e-5)
        if stale.any():
            assert m["staleness/logprob_gap"] == pytest.approx(gap[stale > 0].mean(), rel=1e-5)
        assert m["staleness/sampled_frac"] == stale.mean()
        assert all(np.isfinite(v) for v in m.values())
    blown = metrics.drop_unmeasured({"mismatch/logprob_gap": float("nan"),
                                     "mismatch/sampled_tokens": 5.0})
    assert np.isnan(blown["mismatch/logprob_gap"])


def test_stale_trials_need_the_off_policy_correction():
    """One-step-off or carry-over with a ratio against the trainer's current weights and no TIS
    ignores the behaviour policy: refused naming the keys; the decoupled objective (TIS, the
    default) and plain PPO against the rollout's log-probs pass, as does fresh data."""
    from t1jax.rl.loop import check_off_policy_correction
    plain = Settings(tis=False)
    for schedule, carry_over, keys in (("one_step_off", False, ["schedule='one_step_off'"]),
                                       ("sync", True, ["carry_over=True"]),
                                       ("one_step_off", True, ["one_step_off", "carry_over"])):
        with pytest.raises(ValueError, match="rl.tis=False") as err:
            check_off_policy_correction(plain, schedule, carry_over)
        assert all(k in str(err.value) for k in keys + ["rl.old_logprobs='recompute'"])
        check_off_policy_correction(Settings(), schedule, carry_over)  # tis=True by default
        check_off_policy_correction(Settings(old_logprobs="rollout", tis=False), schedule,
                                    carry_over)
    check_off_policy_correction(plain, "sync", False)
    assert Settings.from_config(rl_config()).tis  # the configs' default: the decoupled one


# -- Settings ------------------------------------------------------------------------------------


def test_settings_from_config():
    s = Settings.from_config(rl_config())
    assert s == Settings(**dict(rl_config().items()))
    assert s.r3 and s.old_logprobs == "recompute" and not s.uses_reference
    hash(s)
    bad = rl_config()
    bad.not_a_field = 1
    with pytest.raises(ValueError, match="not_a_field"):
        Settings.from_config(bad)
    bad = rl_config()
    bad.old_logprobs = "reference"
    with pytest.raises(ValueError, match="old_logprobs"):
        Settings.from_config(bad)
    bad = rl_config()
    bad.old_logprobs, bad.tis = "rollout", True  # the double correction
    with pytest.raises(ValueError, match=r"rl\.tis=True with rl\.old_logprobs='rollout'"):
        Settings.from_config(bad)
    with pytest.raises(ValueError, match="twice"):
        dataclasses.replace(s, old_logprobs="rollout", tis=True)
    for field in ("minibatches", "epochs"):
        bad = rl_config()
        bad[field] = 0
        with pytest.raises(ValueError):
            Settings.from_config(bad)
    assert Settings.from_config({"kl_loss_coef": 0.1}).uses_reference


def test_pack_leaves_out_the_tail_after_the_last_sampled_token():
    """Observation glue after the last sampled token trains nothing: it is not packed, so an
    episode that ended on its context budget is not overlong."""
    s = make_sample(60, 0)
    tail = make_sample(60, 0)
    tail.loss_mask[50:] = 0
    packed = do_pack([tail])
    (_, row, start, end), = packed.placements
    assert end - start == 50 and packed.batch.shape[1] == 64
    np.testing.assert_array_equal(packed.batch.tokens[row, start:end], tail.tokens[:50])
    assert packed.batch.rewards[row, start + 49] == tail.reward
    assert do_pack([s]).placements[0][3] == 60


def test_explained_variance_is_nan_for_constant_returns():
    mask = jnp.ones((2, 5))
    returns = jnp.full((2, 5), 0.5)
    assert np.isnan(float(ppo.explained_variance(returns * 0.3, returns, mask)))


# -- a trial longer than a row: split at chunk boundaries, GAE linked across rows ---------------


def chunked_sample(seed, n, chunk_starts, reward=None, task="t"):
    """A multi-chunk trial: each chunk a prompt then two sampled replies."""
    s = make_sample(n, seed, chunk_starts=chunk_starts, reward=reward, task=task)
    mask = np.zeros(n, np.int8)
    for c0, c1 in zip(chunk_starts, list(chunk_starts[1:]) + [n]):
        m = c1 - c0
        mask[c0 + m // 3: c0 + m // 2] = 1
        mask[c0 + (3 * m) // 4: c1] = 1
    s.loss_mask = mask
    s.rollout_logprobs = np.where(mask, s.rollout_logprobs - 0.1, 0.0).astype(np.float32)
    return s


def test_pack_splits_a_long_trial_into_rows_of_whole_chunks():
    s = chunked_sample(0, 100, [0, 30, 55, 80], reward=0.75)
    short = make_sample(20, 1)
    packed = do_pack([s, short])
    b = packed.batch
    assert b.shape[1] == 64
    pieces = [(p, c) for p, c in zip(packed.placements, packed.piece_starts) if p[0] == 0]
    assert [c for _, c in pieces] == [0, 55]  # chunks 0:30 + 30:55 fit 64, then 55:100
    (_, r0, s0, e0), (_, r1, s1, e1) = (p for p, _ in pieces)
    assert r0 != r1 and (e0 - s0, e1 - s1) == (55, 45)
    np.testing.assert_array_equal(b.tokens[r0, s0:e0], s.tokens[:55])
    np.testing.assert_array_equal(b.tokens[r1, s1:e1], s.tokens[55:])
    np.testing.assert_array_equal(b.routes[r1, s1:e1], s.routes[55:])
    np.testing.assert_array_equal(b.positions[r1, s1:e1],
                                  np.concatenate([np.arange(25), np.arange(20)]))
    np.testing.assert_array_equal(b.loss_mask[r1, s1:e1], expected_mask(s)[55:])
    # the reward is on the trial's last sampled token only, in its last piece
    assert b.rewards[r0].sum() == 0 and b.rewards[r1, e1 - 1] == pytest.approx(0.75)
    # every token of the first piece links to the second piece's first sampled token
    first = r1 * 64 + s1 + int(np.flatnonzero(b.loss_mask[r1, s1:e1])[0])
    assert np.all(b.continues_at[r0, s0:e0] == first)
    assert np.sum(b.continues_at >= 0) == e0 - s0  # nothing else links anywhere
    # one trial id per piece in its row: GAE never runs from one row's piece into a neighbour
    assert len(set(b.trial_ids[r0, s0:e0])) == 1 and len(set(b.trial_ids[r1, s1:e1])) == 1


def test_pack_refuses_a_single_chunk_longer_than_a_row():
    s = chunked_sample(0, 110, [0, 20, 90], task="long-chunk-")
    with pytest.raises(OverlongSample, match=r"long-chunk-0.*chunk of 70 tokens \(tokens 20:90\)"):
        do_pack([s])
    assert [i for i, _ in do_pack([s, make_sample(9, 1)], overlong="drop").dropped] == [0]


def _per_sample(packed, field, samples):
    """field [B, L] back to each sample's token positions (NaN where nothing was packed)."""
    out = [np.full(len(s.tokens), np.nan) for s in samples]
    for (i, row, start, end), c in zip(packed.placements, packed.piece_starts):
        out[i][c:c + end - start] = np.asarray(field)[row, start:end]
    return out


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.7), (1.0, 0.0)])
def test_gae_of_a_trial_split_over_rows_equals_gae_in_one_row(gamma, lam):
    """However a trial is cut into rows (and mixed with other trials), every token's advantage
    and return are the ones GAE gives the whole trial in one row."""
    rng = np.random.RandomState(3)
    samples = [chunked_sample(0, 150, [0, 30, 62, 80, 101, 130]),
               chunked_sample(1, 90, [0, 40, 61]), make_sample(25, 2), make_sample(40, 3),
               chunked_sample(4, 200, [0, 50, 99, 150])]
    values = [rng.randn(len(s.tokens)).astype(np.float32) for s in samples]

    def run(buckets):
        packed = do_pack(samples, buckets=buckets)
        v = np.zeros(packed.batch.shape, np.float32)
        for (i, row, start, end), c in zip(packed.placements, packed.piece_starts):
            v[row, start:end] = values[i][c:c + end - start]
        b = packed.batch
        adv, ret = ppo.gae(jnp.asarray(b.rewards), jnp.asarray(v), jnp.asarray(b.loss_mask),
                           jnp.asarray(b.trial_ids), gamma, lam, jnp.asarray(b.continues_at))
        return packed, _per_sample(packed, adv, samples), _per_sample(packed, ret, samples)

    whole, adv1, ret1 = run((256,))
    split, adv2, ret2 = run((16, 32, 64))
    assert len(whole.placements) == len(samples) and len(split.placements) >= len(samples) + 5
    for i, s in enumerate(samples):
        m = expected_mask(s)[:len(adv1[i])] > 0
        m &= ~np.isnan(adv1[i])
        np.testing.assert_allclose(adv2[i][m], adv1[i][m], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret2[i][m], ret1[i][m], rtol=1e-5, atol=1e-5)
        if gamma == lam == 1.0:  # Monte Carlo: every sampled token's return is the reward
            np.testing.assert_allclose(ret2[i][m], s.reward, rtol=1e-5)
    # without the links, the pieces before a trial's last would never see its reward
    b = split.batch
    linked = (b.continues_at >= 0) & (b.loss_mask > 0)
    for links in (None, jnp.asarray(b.continues_at)):
        _, ret = ppo.gae(jnp.asarray(b.rewards), jnp.zeros(b.shape), jnp.asarray(b.loss_mask),
                         jnp.asarray(b.trial_ids), 1.0, 1.0, links)
        assert (np.asarray(ret)[linked] != 0).all() == (links is not None)


def test_staleness_counts_turns_behind_the_policy_being_trained():
    """One-step-off turns are 1 behind, a carried-over trial's early turns more; versions that
    are no step number (a recording made elsewhere, a test double) are left out."""
    from t1jax.rollout.sample import staleness

    def sample(versions):
        return Sample(tokens=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -1.0],
                      routes=np.zeros((2, 1, 1)), reward=0.0,
                      metadata={"weight_versions": versions})
    got = staleness([sample(["4", "4"]), sample(["2", "3", "4"]), sample(["v0"])], 4)
    assert got == {"staleness/version_lag_mean": pytest.approx(0.6),
                   "staleness/version_lag_max": 2, "staleness/stale_turn_frac": 0.4}
    assert staleness([sample(["5"])], 5)["staleness/stale_turn_frac"] == 0.0
    assert staleness([sample(["v0"]), sample([])], 3) == {}


def test_training_reward_per_family():
    """sample_stats adds each family's mean reward, resolved rate and trial count (metadata
    "category", which training and evaluation samples carry); trials without one are left out."""
    from t1jax.rl.metrics import sample_stats
    samples = [make_sample(12, i, reward=r) for i, r in enumerate((1.0, 0.5, 0.25, 0.75))]
    for s, family, solved in zip(samples, ("sort", "copy", "sort", None),
                                 (True, False, False, True)):
        s.metadata.update(category=family, verifier={"solved": solved})
    stats = sample_stats(samples)
    assert stats["family/sort/reward"] == pytest.approx(0.625)
    assert stats["family/sort/resolved"] == 0.5 and stats["family/sort/trials"] == 2
    assert stats["family/copy/reward"] == 0.5 and stats["family/copy/resolved"] == 0.0
    assert not [k for k in stats if k.startswith("family/None")]


def test_sft_learning_rate_decays_to_zero_at_the_last_step():
    from t1jax.rl.trainer import sft_learning_rate
    assert sft_learning_rate(3e-3, "constant", 600) == 3e-3
    cosine = sft_learning_rate(3e-3, "cosine", 600)
    assert float(cosine(0)) == pytest.approx(3e-3)
    assert float(cosine(300)) == pytest.approx(1.5e-3)
    assert float(cosine(600)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="sft.lr_schedule"):
        sft_learning_rate(3e-3, "linear", 600)


def test_warmup_health_needs_a_window_of_positive_explained_variance():
    """Critic Warm-Up's stop rule: min steps, the mean of the last `window` held-out explained
    variances above min_ev; a NaN step (constant returns) counts against; window 0: never."""
    from t1jax.rl.critic import warmup_health
    gate = dict(min_steps=4, window=3, min_ev=0.0)
    assert warmup_health([0.0, -0.2, 0.1, 0.2], **gate) == (True, pytest.approx(0.1 / 3))
    assert not warmup_health([0.5, 0.5, 0.5], **gate)[0]  # fewer than min_steps
    assert not warmup_health([0.0, 0.5, -0.4, -0.2, 0.1], **gate)[0]  # mean -0.5 / 3
    assert not warmup_health([0.0, 0.3, 0.3, float("nan"), 0.3], **gate)[0]
    assert warmup_health([0.0, 0.3, 0.3, float("nan"), 0.3, 0.3, 0.3], **gate)[0]
    assert not warmup_health([0.9] * 10, min_steps=4, window=0, min_ev=0.0)[0]
    assert not warmup_health([0.1] * 6, min_steps=4, window=3, min_ev=0.2)[0]
