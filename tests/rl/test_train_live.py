"""PPO on live rollouts: a small policy drives real Docker sandboxes through the embedded
engine, the verifier scores each trial, the trainer steps, and each new policy is published
to the engine. One step off-policy, step t+1's trials are sampled by the weights of step t-1
(their recorded weight versions say so); synchronously, by the weights of step t."""

import json

import jax
import pytest

from configs import tiny_cpu
from t1jax.jobs import build
from t1jax.model.config import model_config_from
from t1jax.rl import loop
from t1jax.rollout.sample import load_samples
from t1jax.rl.trainer import Trainer
from t1jax.sharding import make_mesh


pytestmark = pytest.mark.slow


def small_config(schedule):
    """The recipe's config at a small size, with rows long enough for the bundled tasks'
    prompts (the default agent prompt is ~1.1k tokens of the offline tokenizer)."""
    config = tiny_cpu.get_config()
    config.model.update(dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                             moe_intermediate_size=32, num_attention_heads=4, num_experts=8))
    config.rl.update(dict(max_length=2048, min_length=2048))
    config.rollouts.update(dict(batch_size=2, oversample=1.0, max_turns=2, max_new_tokens=24,
                                system_prompt=""))  # the agent's own
    config.sandbox.concurrency = 2
    config.schedule = schedule
    return config


def live_source(config, trainer, workdir):
    """The live rollouts the recipe's Warm-Up and PPO play (build.live_rollouts), here of two
    bundled tasks with the offline tokenizer and the agent's own system prompt."""
    from t1jax.tasks.pool import default_pool_dir, load_pool, select_tasks
    tasks = select_tasks(load_pool(default_pool_dir()).tasks, "count-log-errors,organize-files")
    return build.live_rollouts(config, trainer, workdir,
                               build.task_stack(config, tasks, build.tokenizer()))


@pytest.mark.parametrize("schedule", ["sync", "one_step_off"])
def test_live_ppo_publishes_weights(docker_backend, tmp_path, schedule):
    config = small_config(schedule)
    trainer = Trainer(model_config_from(config.model), config.rl,
                      make_mesh(devices=jax.devices()[:1]), seed=0)
    source = live_source(config, trainer, tmp_path)
    history = loop.run(trainer, source, tmp_path, loop.LoopOptions(steps=2, schedule=schedule))
    assert len(history) == 2 and source.engine.weight_version == "2"
    for step in range(2):
        samples = load_samples(tmp_path / "rollouts" / f"step_{step:05d}")
        assert len(samples) == 2
        versions = {v for s in samples for v in s.metadata["weight_versions"]}
        expected = "0" if schedule == "one_step_off" else str(step)
        assert versions == {expected}, (step, versions)
        for s in samples:
            assert s.metadata["verifier"] is not None and s.routes.shape[1:] == (2, 2)
            assert s.loss_mask.sum() > 0
    for key in ("reward/mean", "critic/explained_variance", "mismatch/routing_disagreement",
                "turns/mean"):
        assert key in history[-1]
    # step 2 trains version 1; one step off, its trials came from version 0: a staleness gap,
    # never reported as the same-weights mismatch
    stale = schedule == "one_step_off"
    assert ("staleness/logprob_gap" in history[-1]) == stale
    assert ("mismatch/logprob_gap" in history[-1]) == (not stale)
    assert history[-1]["staleness/sampled_frac"] == (1.0 if stale else 0.0)
    # same model, same precision, replayed routes: the rollout's log-probs are the trainer's
    assert history[0]["mismatch/logprob_gap"] < 1e-3
    assert history[0]["mismatch/routing_disagreement"] < 0.05


def test_live_ppo_with_compaction_splits_long_trials_over_rows(docker_backend, tmp_path):
    """Context compaction on in live training: chunks of 1300 tokens (the agent prompt alone is
    ~1.2k, so about every turn compacts), trials of up to 8k tokens, rows of 2k. A trial of two
    turns or more is longer than a row and trains split over rows at its chunk boundaries, and
    the replayed forward still reproduces the rollout. The rollouts are seeded: unseeded, the
    random policy answers "done" at its first turn in ~13% of trials, and a CI run once drew
    three such trials; with this seed all three here run their five turns."""
    config = small_config("sync")
    config.model.max_position_embeddings = 2048
    config.rollouts.update(dict(compaction="elide", context_tokens=1300, trial_tokens=8000,
                                max_turns=5, batch_size=3, sampling_seed=3))
    trainer = Trainer(model_config_from(config.model), config.rl,
                      make_mesh(devices=jax.devices()[:1]), seed=0)
    source = live_source(config, trainer, tmp_path)
    history = loop.run(trainer, source, tmp_path, loop.LoopOptions(steps=1))
    samples = load_samples(tmp_path / "rollouts" / "step_00000")
    assert len(samples) == 3
    for s in samples:
        starts = list(s.chunk_starts) + [len(s.tokens)]
        assert max(b - a for a, b in zip(starts, starts[1:])) <= 1300
        assert len(starts) - 1 == s.metadata["compactions"] + 1
    split = [s for s in samples  # what the packer places: up to the last sampled id
             if s.last_response_index + 1 > config.rl.max_length]
    assert split, [(s.metadata["turns"], s.metadata["finish"]) for s in samples]
    m = history[0]
    assert m["batch/split_trials"] == len(split) and m["batch/dropped_overlong"] == 0
    assert m["chunks/mean"] > 1 and m["chunks/compactions"] >= 1
    assert m["mismatch/logprob_gap"] < 1e-3


@pytest.mark.parametrize("via_router", [False, True], ids=["direct", "router"])
def test_live_ppo_through_a_server_fleet(docker_backend, tmp_path, via_router):
    """The same loop with the policy served over HTTP (a t1jax engine server speaking SGLang's
    /generate): each step's weights are exported as HF safetensors and loaded by the server.
    via_router: the trials' generation goes through the SGLang model gateway (smg, the real
    router; config.rollouts.fleet_router), sticky by trial: every later turn of a trial reuses
    its prefix on the worker; weights are still published to the worker itself."""
    import urllib.request

    from t1jax.model.hf_io import export_hf
    from test_rollout_server import free_port, start_server, wait_healthy
    from test_router import start_router
    config = small_config("sync")
    trainer = Trainer(model_config_from(config.model), config.rl,
                      make_mesh(devices=jax.devices()[:1]), seed=0)
    path = export_hf(trainer.actor_model(), tmp_path / "initial")
    port = free_port()
    proc, router = start_server(path, port, max_len=config.rl.max_length), None
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, timeout_s=120)
        config.rollouts.update(dict(engine="fleet", fleet_urls=url))
        if via_router:
            router_port = free_port()
            router = start_router(router_port, [url], tmp_path / "router.log")
            config.rollouts.fleet_router = f"http://127.0.0.1:{router_port}"
            wait_healthy(config.rollouts.fleet_router, router, timeout_s=60)
        source = live_source(config, trainer, tmp_path)
        history = loop.run(trainer, source, tmp_path, loop.LoopOptions(steps=1))
        client = source.engine.client
        served = {u for u, n in client.served.items() if n}
        assert served == {config.rollouts.fleet_router if via_router else url}
        with urllib.request.urlopen(url + "/get_server_info", timeout=10) as r:
            stats = json.loads(r.read())["internal_states"][0]
        samples = load_samples(tmp_path / "rollouts" / "step_00000")
        later_turns = sum(int(s.metadata["turns"]) for s in samples) - len(samples)
        assert 0 < stats["session_hits"] <= later_turns  # a trial's turns stay on its row
        # each position's routes crossed the wire once per trial (routed_experts_start_len):
        # at most a row per sampled token, fewer than whole-sequence routes every turn
        assert 0 < stats["route_rows_sent"] <= sum(len(s.tokens) - 1 for s in samples)
        assert stats["route_rows_sent"] < stats["route_rows_whole"]
        assert client.model_info(url)["weight_version"] == "1"
        assert (tmp_path / "published" / "weights_1" / "config.json").is_file()
        samples = load_samples(tmp_path / "rollouts" / "step_00000")
        assert {v for s in samples for v in s.metadata["weight_versions"]} == {"0"}
        assert history[0]["mismatch/logprob_gap"] < 1e-3
    finally:
        for p in (proc, router):
            if p is not None:
                p.kill()
                p.wait()
