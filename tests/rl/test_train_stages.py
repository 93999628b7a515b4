"""The stages hand over exactly what T1 says: Critic Warm-Up's critic parameters (and no
optimizer moments) start PPO, the SFT actor starts the policy, and the one-step off-policy
schedule trains on the same data as the synchronous one (recorded rollouts: identical
parameters), publishing a new weight version after every step."""


import jax
from flax import nnx
import numpy as np
import optax
import pytest

from t1jax import sharding
from t1jax.rl import loop
from t1jax.rl.trainer import Trainer
from test_sharding import tiny_config
from test_train_resume import record

from configs.common import rl_config


def make_trainer(seed=0, **rl_overrides):
    rl = rl_config()
    rl.update(dict(max_length=128, min_length=128, actor_lr=1e-3, critic_lr=1e-3,
                   **rl_overrides))
    return Trainer(tiny_config(vocab_size=512), rl, sharding.make_mesh(devices=jax.devices()[:1]),
                   seed=seed)


def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def assert_tree_equal(a, b):
    for x, y in zip(jax.tree.leaves(host(a)), jax.tree.leaves(host(b))):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("rollouts")
    record(path)
    return path


@pytest.mark.slow
def test_warmup_critic_only_then_ppo(recorded, tmp_path):
    warm = make_trainer()
    actor_before = host(warm.state.actor)
    loop.run(warm, loop.RecordedRollouts(recorded), tmp_path / "warmup",
             loop.LoopOptions(steps=2, stage="critic_warmup"))
    assert_tree_equal(warm.state.actor, actor_before)  # the actor stays frozen
    warm_critic = host(warm.state.critic)

    ppo = make_trainer()
    fresh_actor, fresh_opt = host(ppo.state.actor), host(ppo.state.critic_opt)
    assert loop.load_critic_only(ppo, tmp_path / "warmup" / "checkpoints") == 2
    assert_tree_equal(ppo.state.critic, warm_critic)
    assert_tree_equal(ppo.state.actor, fresh_actor)
    assert_tree_equal(ppo.state.critic_opt, fresh_opt)  # no moments cross runs
    adam = [s for s in jax.tree.leaves(ppo.state.critic_opt, is_leaf=lambda s: isinstance(
        s, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)][0]
    assert int(adam.count) == 0 and all((np.asarray(m) == 0).all()
                                        for m in jax.tree.leaves(adam.mu))
    metrics = ppo.ppo_step(loop.RecordedRollouts(recorded).collect(0))
    assert np.isfinite(metrics["critic/explained_variance"])

    # a resumed warm-up samples from the restored actor: the engines get it before any
    # rollout (they were built from the new process's random one)
    class Publishing(loop.RecordedRollouts):
        last_metrics = {"rollout/infra_failures": 0, "staleness/version_lag_max": 2}

        def publish(self, trainer, version):
            super().publish(trainer, version)
            self.actors = [*getattr(self, "actors", []), host(trainer.state.actor)]

    resumed, source = make_trainer(seed=1), Publishing(recorded)
    (row,) = loop.run(resumed, source, tmp_path / "warmup",
                      loop.LoopOptions(steps=3, stage="critic_warmup"))
    assert source.published == ["2"]
    # a source's step metrics reach the row; staleness not: Warm-Up's policy never moves
    assert row["rollout/infra_failures"] == 0 and "staleness/version_lag_max" not in row
    assert_tree_equal(source.actors[0], actor_before)


@pytest.mark.slow
def test_warmup_stops_once_healthy_checkpointed_and_resumes_past_it(recorded, tmp_path):
    """loop.run(stop=...): the run ends after the step the predicate accepts, with that step
    checkpointed (the next phase loads it) even off the checkpoint cadence."""
    from t1jax.checkpoint import finalized_steps
    seen = []

    def stop(step, metrics):
        seen.append((step, np.isfinite(metrics["critic/explained_variance"])))
        return step == 2

    history = loop.run(make_trainer(), loop.RecordedRollouts(recorded), tmp_path / "warmup",
                       loop.LoopOptions(steps=5, stage="critic_warmup", checkpoint_every=4),
                       stop=stop)
    assert len(history) == 2 and seen == [(1, True), (2, True)]
    assert finalized_steps(tmp_path / "warmup" / "checkpoints")[-1] == 2


@pytest.mark.slow
def test_sft_then_actor_only(recorded, tmp_path):
    sft = make_trainer()
    data = loop.RecordedRollouts(recorded).collect(0)
    history = loop.run(sft, loop.DatasetBatches(data, batch_size=4), tmp_path / "sft",
                       loop.LoopOptions(steps=6, stage="sft"))
    assert history[-1]["sft/nll"] < history[0]["sft/nll"] - 0.05
    ppo = make_trainer(kl_loss_coef=0.1)
    assert loop.load_actor_only(ppo, tmp_path / "sft" / "checkpoints") == 6
    assert_tree_equal(ppo.state.actor, sft.state.actor)
    assert_tree_equal(ppo.state.reference, sft.state.actor)  # KL anchors to the SFT policy
    # the critic's backbone restarts from the SFT actor; its value head stays its own
    flat_actor = dict(nnx.to_flat_state(sft.state.actor))
    copied = head = 0
    for path, var in nnx.to_flat_state(ppo.state.critic):
        if path[0] == "model":
            np.testing.assert_array_equal(np.asarray(var.get_value()),
                                          np.asarray(flat_actor[path].get_value()))
            copied += 1
        else:
            head += 1
    assert copied > 10 and head >= 1
    ppo.ppo_step(data)  # the critic owns its buffers: the donated step does not clash


def test_dataset_batches_cover_each_epoch():
    items = list(range(10))
    source = loop.DatasetBatches(items, batch_size=4, seed=3)
    first_epoch = source.collect(0) + source.collect(1) + source.collect(2)[:2]
    assert sorted(first_epoch) == items
    assert source.collect(5) == loop.DatasetBatches(items, batch_size=4, seed=3).collect(5)


class Recording(loop.RecordedRollouts):
    def __init__(self, directory):
        super().__init__(directory)
        self.events = []

    def collect(self, step):
        self.events.append(("collect", step, self.published[-1] if self.published else None))
        return super().collect(step)


@pytest.mark.slow
def test_schedules(recorded, tmp_path):
    params = {}
    for schedule in ("sync", "one_step_off"):
        trainer = make_trainer()
        source = Recording(recorded)
        loop.run(trainer, source, tmp_path / schedule,
                 loop.LoopOptions(steps=3, schedule=schedule))
        assert source.published == ["0", "1", "2", "3"]
        stale = [step - int(version) for _, step, version in source.events]
        # sync: step t's rollouts start once weights t are out; one step off: they start
        # while step t-1 trains, so they use weights t-1
        assert stale == ([0, 0, 0] if schedule == "sync" else [0, 1, 1]), schedule
        params[schedule] = host(trainer.state.actor)
    assert_tree_equal(params["sync"], params["one_step_off"])  # same recorded data


@pytest.mark.slow
def test_actor_from_hugging_face_dir(tmp_path):
    from t1jax.model.hf_io import export_hf
    source = make_trainer(seed=7)
    export_hf(source.actor_model(), tmp_path / "hf")
    trainer = make_trainer(kl_loss_coef=0.1)
    loop.load_actor_hf(trainer, tmp_path / "hf")
    assert_tree_equal(trainer.state.actor, source.state.actor)
    assert_tree_equal(trainer.state.reference, source.state.actor)
    flat = dict(nnx.to_flat_state(source.state.actor))
    for path, var in nnx.to_flat_state(trainer.state.critic):
        if path[0] == "model":
            np.testing.assert_array_equal(np.asarray(var.get_value()),
                                          np.asarray(flat[path].get_value()))
