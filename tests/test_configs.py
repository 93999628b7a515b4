"""Every config file loads through experiments/run.py's loader with each of its variants, names
a known mode, and locks (a misspelt --config.flag fails instead of being ignored)."""

import importlib
from pathlib import Path

import ml_collections
import pytest

from t1jax.jobs import MODES

ROOT = Path(__file__).resolve().parents[1]
JOB_CONFIGS = {
    "oracle": [None, "smoke"], "audit": [None], "synth": [None], "pool": [None],
    "ppo": [None, "sft", "critic_warmup"], "eval": [None, "smoke"], "tiny_cpu": [None],
}


def test_every_config_file_is_listed():
    files = {p.stem for p in (ROOT / "configs").glob("*.py")} - {"common", "__init__"}
    assert files == set(JOB_CONFIGS)


@pytest.mark.parametrize("name,arg", [(n, a) for n, args in JOB_CONFIGS.items() for a in args])
def test_config_loads_and_locks(name, arg):
    config = importlib.import_module(f"configs.{name}").get_config(arg)
    assert isinstance(config, ml_collections.ConfigDict)
    assert config.mode in MODES
    importlib.import_module(MODES[config.mode])  # its job imports
    config.lock()
    with pytest.raises(AttributeError):
        config.no_such_option = 1


def test_model_configs_build_model_configs():
    from t1jax.model.config import model_config_from
    for path in (ROOT / "configs" / "model").glob("*.py"):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"configs.model.{path.stem}")
        cfg = model_config_from(module.get_config().model)
        assert cfg.num_hidden_layers > 0 and cfg.num_experts_per_tok <= cfg.num_experts


def test_recipe_rejects_unknown_phase(tmp_path):
    from t1jax.jobs import UsageError, recipe
    config = importlib.import_module("configs.tiny_cpu").get_config()
    config.phases = "pool,bogus"
    with pytest.raises(UsageError, match="bogus"):
        recipe.run(config, tmp_path)
