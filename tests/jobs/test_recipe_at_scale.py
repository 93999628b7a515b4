"""The main job's driver on the real-scale path, at toy size: what configs/qwen3_30b_a3b.py and
t1_qwen35_122b.py change (an outside pool folder, the model's own tokenizer, a Hugging Face
base checkpoint, generation and evaluation on a fleet of servers) through the same phases as
the laptop run, with real sandboxes and a real t1jax server speaking SGLang's /generate."""

import json
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import run_toy_recipe


pytestmark = pytest.mark.slow


def _hf_checkpoint(folder: Path, tokenizer: Path, seed: int):
    """The tiny model at `seed`'s init as an HF folder with `tokenizer` beside it."""
    from configs import tiny_cpu
    from t1jax.jobs import build
    from t1jax.model.hf_io import export_hf
    config = tiny_cpu.get_config()
    config.seed = seed
    export_hf(build.policy(config), folder)
    shutil.copyfile(tokenizer, folder / "tokenizer.json")
    return config


def _logprob_gap(model, sample) -> float:
    """Largest |log p(sampled token)| difference between `model` (teacher forcing) and what
    the engine recorded, over the sampled tokens."""
    import jax.numpy as jnp

    from t1jax.rl.trainer import token_logprobs
    tokens = jnp.asarray(sample.tokens[None], jnp.int32)
    lp = np.asarray(token_logprobs(model(tokens).logits, tokens, 1.0))[0]
    mask = sample.loss_mask > 0
    return float(np.abs(lp[mask] - sample.rollout_logprobs[mask]).max())


def test_the_real_scale_path_through_the_recipe_driver(toy_run, tmp_path):
    from test_rollout_server import free_port, start_server, wait_healthy

    from t1jax.jobs import build
    from t1jax.model.hf_io import load_hf
    from t1jax.rollout.sample import load_samples
    hf = tmp_path / "hf"
    config = _hf_checkpoint(hf, toy_run / "tokenizer.json", seed=7)
    port = free_port()
    server = start_server(hf, port, max_len=config.rl.max_length)
    url, workdir = f"http://127.0.0.1:{port}", tmp_path / "run"
    try:
        wait_healthy(url, server, timeout_s=120)
        proc = run_toy_recipe(
            workdir, "tiny_cpu.py", f"--config.pool.dir={toy_run / 'pool'}",
            "--config.pool.decontaminate=False",  # held-out entities of the same families
            f"--config.rollouts.tokenizer={hf / 'tokenizer.json'}",
            f"--config.init.hf_path={hf}", "--config.rollouts.engine=fleet",
            f"--config.rollouts.fleet_urls={url}", "--config.sft.teacher_slips=False",
            "--config.oracle.train_per_family=1", "--config.ppo.steps=2",
            "--config.eval.every=1")
        with urllib.request.urlopen(url + "/get_model_info", timeout=10) as r:
            served = json.loads(r.read())["weight_version"]
    finally:
        server.kill()
        server.wait()

    # the outside pool is linked, never copied or written
    for split in ("train", "heldout", "validation"):
        assert (workdir / "pool" / split).resolve() == (toy_run / "pool" / split).resolve()
    assert not (toy_run / "pool" / "train" / "DONE").exists()
    assert (workdir / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    assert f"actor and critic backbone from {hf}" in proc.stderr  # SFT starts from it
    for phase in ("pool", "oracle", "sft", "warmup", "ppo"):
        assert (workdir / phase / "DONE").is_file(), phase
    heldout = len(list((toy_run / "pool" / "heldout").iterdir()))
    for label in ("base", "sft", "ppo"):
        summary = json.loads((workdir / "eval" / label / "summary.json").read_text())
        assert summary["trials"] == heldout, label
    assert (workdir / "eval" / "validation" / "step_0001" / "summary.json").is_file()
    assert (workdir / "report" / "summary.md").is_file()

    # every evaluation played on the fleet, each policy published to it first; the folders
    # it read are removed, PPO's newest weights stay
    assert served == "eval-validation-ppo"
    assert not list((workdir / "published").iterdir())
    assert [p.name for p in (workdir / "ppo" / "published").iterdir()] == ["weights_2"]
    # a whole model folder: a server can be started on it (SGLang reads the tokenizer there)
    published = workdir / "ppo" / "published" / "weights_2"
    assert (published / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    for rows in ("eval/base", "eval/ppo", "eval/validation/step_0001"):
        trials = [json.loads(line) for line in
                  (workdir / rows / "trials.jsonl").read_text().splitlines()]
        assert trials and all(t.get("error") is None for t in trials), rows
    # the base evaluation is the Hugging Face checkpoint's policy, not a random init
    sample = load_samples(workdir / "eval" / "base" / "samples")[0]
    ours = load_hf(build.policy(config), hf)
    random_init = build.policy(_hf_checkpoint(tmp_path / "other", hf / "tokenizer.json", 0))
    assert _logprob_gap(ours, sample) < 1e-3
    assert _logprob_gap(random_init, sample) > 0.1
    # PPO's trials were sampled by the weights the trainer published (R3 + fleet)
    rows = [json.loads(line) for line in (workdir / "ppo" / "metrics.jsonl").read_text()
            .splitlines()]
    assert len(rows) == 2 and all(r["mismatch/logprob_gap"] < 1e-3 for r in rows)


def test_an_outside_pool_is_checked_before_anything_runs(tmp_path):
    """Each mistake in where things come from is named by its key before any phase runs, and
    a train split that copies a test task is refused."""
    from configs import tiny_cpu
    from t1jax.jobs import UsageError, recipe
    config = tiny_cpu.get_config()
    config.pool.dir = str(tmp_path / "pool")
    with pytest.raises(UsageError, match="no train or heldout folder"):
        recipe.run(config, tmp_path / "a")
    task = Path(__file__).resolve().parents[2] / "t1jax" / "tasks" / "seed_tasks"
    first = sorted(task.iterdir())[0]
    for split in ("train", "heldout"):
        shutil.copytree(first, tmp_path / "pool" / split / first.name)
    with pytest.raises(UsageError, match="rollouts.tokenizer"):
        recipe.run(config, tmp_path / "a")
    config.rollouts.tokenizer = str(tmp_path / "tokenizer.json")
    with pytest.raises(UsageError, match="is not a file"):
        recipe.run(config, tmp_path / "a")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(UsageError, match="teacher_slips"):
        recipe.run(config, tmp_path / "a")
    config.sft.teacher_slips = False
    config.init.hf_path = str(tmp_path)
    with pytest.raises(UsageError, match="init.hf_path=.* has no config.json"):
        recipe.run(config, tmp_path / "a")
    other = tiny_cpu.get_config()
    other.model.num_hidden_layers += 1
    (tmp_path / "config.json").write_text(json.dumps(_hf_dict(other)))
    with pytest.raises(UsageError, match="num_hidden_layers"):
        recipe.run(config, tmp_path / "a")
    config.init.hf_path = ""
    config.phases = "pool"
    with pytest.raises(UsageError, match="overlaps a held-out one"):
        recipe.run(config, tmp_path / "a")
    assert not (tmp_path / "a" / "pool" / "DONE").exists()


def _hf_dict(config) -> dict:
    from t1jax.model.config import model_config_from
    return model_config_from(config.model).to_hf_dict()
