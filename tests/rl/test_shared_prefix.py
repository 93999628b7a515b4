"""SFT rows that share their opening tokens run them once (t1jax/rl/shared_prefix.py): when the
prefix may be shared (one sequence per row, same tokens, nothing trained in it), and that the
SFT step then computes the full rows' loss and update, on one device and sharded over 8."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from t1jax import sharding
from t1jax.rl.shared_prefix import shared_prefix_length, suffix_length
from t1jax.rl.trainer import Settings, Trainer, actor_forward
from t1jax.rollout.sample import Sample

from test_sharding import tiny_config

CFG = tiny_config()
SETTINGS = Settings(min_length=128, max_length=128, actor_lr=1e-3, adam_eps=1e-4)
PROMPT = 90  # tokens every sample opens with (a system prompt)


def prompt_samples(n=8, seed=0):
    """n samples: the same PROMPT tokens, then a per-sample instruction and a trained reply."""
    rng = np.random.RandomState(seed)
    prompt = rng.randint(1, CFG.vocab_size, PROMPT)
    out = []
    for i in range(n):
        own = rng.randint(1, CFG.vocab_size, rng.randint(20, 36))
        mask = np.zeros(PROMPT + len(own), np.int8)
        mask[PROMPT + 6:] = 1  # the instruction (6 tokens) is not trained
        tokens = np.concatenate([prompt, own])
        out.append(Sample(tokens=tokens, loss_mask=mask,
                          rollout_logprobs=np.zeros(len(tokens), np.float32),
                          routes=np.full((len(tokens), CFG.num_hidden_layers,
                                          CFG.num_experts_per_tok), -1, np.int32),
                          reward=0.0, metadata={"task_id": f"t{i}"}))
    return out


def rows(lengths, prefix_tokens, trained_from, width=128):
    """Host arrays of one right-padded sequence per row sharing `prefix_tokens` tokens."""
    tokens = np.tile(np.arange(1, width + 1), (len(lengths), 1))
    tokens[:, prefix_tokens:] += np.arange(len(lengths))[:, None] * 1000
    seg = (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    pos = np.where(seg > 0, np.arange(width)[None], 0)
    mask = ((np.arange(width)[None] >= trained_from) & (seg > 0)).astype(np.float32)
    return tokens * seg, pos, seg, mask


def test_the_prefix_is_the_agreed_untrained_part_rounded_down():
    t, p, s, m = rows([120, 110, 100], prefix_tokens=90, trained_from=96)
    assert shared_prefix_length(t, p, s, m) == 80  # 90 agree -> a multiple of 16
    assert suffix_length(s, 80) == 48  # longest rest 40 -> 64, capped at the rows' 128 - 80
    assert suffix_length(rows([90, 60], 16, 16, width=200)[2], 16) == 96  # rest 74 -> 96
    t, p, s, m = rows([120, 110, 100], prefix_tokens=90, trained_from=70)
    assert shared_prefix_length(t, p, s, m) == 64  # P and the token after it untrained
    t, p, s, m = rows([120, 110, 100], prefix_tokens=90, trained_from=60)
    assert shared_prefix_length(t, p, s, m) == 0  # under min_length: the plain forward
    assert shared_prefix_length(t, p, s, m, min_length=32, multiple=8) == 56


@pytest.mark.parametrize("case", ["packed", "empty_row", "chunk_restart", "one_row"])
def test_rows_it_cannot_share_run_plain(case):
    t, p, s, m = rows([120, 110, 100], prefix_tokens=90, trained_from=96)
    if case == "packed":  # a second sample in row 0 would attend across samples in a cache
        s[0, 100:120] = 2
    elif case == "empty_row":
        s[2], t[2] = 0, 0
    elif case == "chunk_restart":
        p[1, 100:110] = np.arange(10)
    else:
        t, p, s, m = t[:1], p[:1], s[:1], m[:1]
    assert shared_prefix_length(t, p, s, m) == 0


def _sft_trainer(mesh, share: bool) -> Trainer:
    return Trainer(CFG, dataclasses.replace(SETTINGS, share_prefix=share), mesh, seed=0)


def _params(trainer):
    return {path: np.asarray(v.get_value())
            for path, v in nnx.to_flat_state(jax.device_get(trainer.state.actor))}


@pytest.mark.parametrize("mesh_shape", [
    dict(devices=1), pytest.param(dict(data=2, fsdp=2, expert=2), marks=pytest.mark.slow)])
def test_sft_steps_with_a_shared_prefix_match_the_full_rows(mesh_shape):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    mesh = (sharding.make_mesh(devices=jax.devices()[:1]) if "devices" in mesh_shape
            else sharding.make_mesh(**mesh_shape))
    full, shared = _sft_trainer(mesh, False), _sft_trainer(mesh, True)
    for step in range(2):
        samples = prompt_samples(seed=step)
        a, b = full.sft_step(samples), shared.sft_step(samples)
        assert a["perf/shared_prefix"] == 0 and b["perf/shared_prefix"] == 80
        for k in ("sft/nll", "sft/token_accuracy", "sft/grad_norm"):
            np.testing.assert_allclose(b[k], a[k], rtol=2e-5, err_msg=k)
    pa, pb = _params(full), _params(shared)
    assert pa.keys() == pb.keys()
    for path in pa:
        np.testing.assert_allclose(pb[path], pa[path], atol=2e-6, err_msg=str(path))
    assert any(k[0].startswith("sft@80+") for k in shared._compiled)


def test_a_shared_prefix_refuses_route_replay():
    trainer = _sft_trainer(sharding.make_mesh(devices=jax.devices()[:1]), True)
    batch, _ = trainer.make_batch(prompt_samples())
    with pytest.raises(ValueError, match="cannot replay routes"):
        actor_forward(trainer.actor_def, trainer.state.actor, batch, True, trainer.s, 1.0,
                      shared=(80, 48))
