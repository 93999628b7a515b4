"""Every config file loads through experiments/run.py's loader with each of its variants, names
a known mode, and locks (a misspelt --config.flag fails instead of being ignored)."""

import importlib
import json
from pathlib import Path

import ml_collections
import pytest

from t1jax.jobs import MODES

ROOT = Path(__file__).resolve().parents[2]
JOB_CONFIGS = {
    "oracle": [None, "smoke"], "audit": [None], "synth": [None], "pool": [None],
    "eval": [None, "smoke", "online", "offline"],
    "tiny_cpu": [None],
    "qwen3_30b_a3b": [None], "qwen3_235b_a22b": [None], "t1_qwen35_122b": [None],
    "ablations": ["no_r3", "binary_reward", "shuffled_reward", "cold_critic", "cold_critic_random_head", "one_step_off", "sync", "no_tito"],
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
    if "rl" in config:  # the blocks validate, not only load
        from t1jax.rl.trainer import Settings
        Settings.from_config(config.rl)
    if "model" in config:
        from t1jax.model.config import model_config_from
        model_config_from(config.model)
    config.lock()
    with pytest.raises(AttributeError):
        config.no_such_option = 1


def _leaves(config, prefix=""):
    out = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        out.update(_leaves(value, path + ".") if isinstance(value, ml_collections.ConfigDict)
                   else {path: value})
    return out


def test_every_knob_has_one_spelling_across_jobs():
    """One spelling per knob (issues #28, #46): the eval job keeps rollout knobs under
    rollouts.*, evaluation knobs under eval.* and the base weights under init.hf_path, as the
    recipe does; no knob of one job sits under another name in the other (a flag means one
    thing in every job). task_filter stays top-level, as the oracle, audit and synth jobs
    spell it."""
    evaluation = _leaves(importlib.import_module("configs.eval").get_config())
    recipe = _leaves(importlib.import_module("configs.tiny_cpu").get_config())
    assert {p for p in evaluation if p.startswith("rollouts.")} <= set(recipe)
    assert {p for p in evaluation if p.startswith("eval.")} - {"eval.max_tokens"} <= set(recipe)
    assert "init.hf_path" in evaluation and "init.hf_path" in recipe
    name = lambda path: path.rsplit(".", 1)[-1]  # noqa: E731
    # a leaf both jobs have under different blocks is the same knob spelt two ways
    elsewhere = {p: sorted(q for q in recipe if name(q) == name(p))
                 for p in evaluation if p not in recipe}
    assert {p: q for p, q in elsewhere.items() if q} == {}


def _restated_defaults(name: str, arg):
    """(file:line, key, value) for every assignment in configs/*.py that sets a key to the
    value it already holds (from a shared block of configs/common.py, whose defaults are the
    code's, or from the config it extends)."""
    import sys
    from ml_collections.config_dict import config_dict
    found, original = [], config_dict.ConfigDict.__setitem__

    def tracing(self, key, value):
        fields = object.__getattribute__(self, "_fields")
        if key in fields and not isinstance(value, (ml_collections.ConfigDict, dict)):
            old = fields[key]
            old = old.get() if isinstance(old, ml_collections.FieldReference) else old
            if type(old) is type(value) and old == value:
                frame = sys._getframe(1)
                while frame is not None and "ml_collections" in frame.f_code.co_filename:
                    frame = frame.f_back
                where = Path(frame.f_code.co_filename) if frame is not None else Path()
                if where.parent == ROOT / "configs":
                    found.append(f"configs/{where.name}:{frame.f_lineno} {key} = {value!r}")
        original(self, key, value)

    config_dict.ConfigDict.__setitem__ = tracing
    try:
        importlib.import_module(f"configs.{name}").get_config(arg)
    finally:
        config_dict.ConfigDict.__setitem__ = original
    return found


# an ablation names its axis, the main job's own value included (ablations.py:sync is the
# comparison arm of :one_step_off)
_NAMED_AXES = {("ablations", "sync")}


@pytest.mark.parametrize("name,arg", [(n, a) for n, args in JOB_CONFIGS.items() for a in args
                                      if (n, a) not in _NAMED_AXES])
def test_no_config_restates_a_default(name, arg):
    """Defaults are written once: in the code that reads them (EpisodeSettings, Settings,
    Limits, FleetClient), taken from there by configs/common.py; a config file sets only what
    differs from the block or config it starts from. A restated value is a second copy that a
    change of the default would leave behind."""
    assert _restated_defaults(name, arg) == []


def test_rollout_defaults_are_the_episode_settings_own():
    from t1jax.rollout.settings import EpisodeSettings
    from configs.common import eval_config, rollouts_config
    r, e = rollouts_config(), eval_config()
    d = EpisodeSettings()
    assert (r.max_turns, r.max_new_tokens, r.tito) == (d.max_turns, d.max_new_tokens, d.tito)
    assert (e.temperature, e.top_p) == (d.temperature, d.top_p)


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


def test_stale_trials_without_a_correction_are_refused_before_the_run(tmp_path):
    """The main job carries trials over; a ratio against the current weights without TIS
    ignores the policy that sampled them: refused before the first phase, naming the keys."""
    from t1jax.jobs import UsageError, recipe
    config = importlib.import_module("configs.tiny_cpu").get_config()
    config.rl.tis = False
    with pytest.raises(UsageError, match=r"carry_over=True.*rl\.tis=False"):
        recipe.run(config, tmp_path / "recipe")
    assert not (tmp_path / "recipe").exists()
    config.schedule, config.rollouts.carry_over = "one_step_off", False
    with pytest.raises(UsageError, match=r"schedule='one_step_off'.*rl\.tis=False"):
        recipe.run(config, tmp_path / "recipe")


def test_ablations_change_one_axis_each():
    from t1jax.rl.trainer import Settings
    main = importlib.import_module("configs.tiny_cpu").get_config().to_dict()
    module = importlib.import_module("configs.ablations")
    for variant in JOB_CONFIGS["ablations"]:
        config = module.get_config(variant)
        Settings.from_config(config.rl)  # the rl block validates
        # the random-head cold critic is one axis away from the zero-head one
        ref = (module.get_config("cold_critic").to_dict()
               if variant == "cold_critic_random_head" else main)
        diff = {k for k in ref if k != "ablation" and config.to_dict()[k] != ref[k]}
        if variant == "no_tito":  # its one consequence: re-encoded trials may be overlong
            rl = {k for k, v in config.rl.to_dict().items() if v != main["rl"][k]}
            assert rl == {"overlong"} and config.rl.overlong == "drop"
            diff -= {"rl"}
        assert len(diff) <= 1, (variant, diff)  # sync spells out the default: no change
    with pytest.raises(ValueError, match="variants"):
        module.get_config(None)


def test_reuse_links_finished_phases_only(tmp_path):
    from t1jax.jobs import UsageError
    from t1jax.jobs.recipe import link_reused
    src, dst = tmp_path / "main", tmp_path / "ablation"
    with pytest.raises(UsageError, match="finished pool"):
        link_reused(src, dst)
    for done in ("pool", "sft", "warmup"):
        (src / done).mkdir(parents=True)
        (src / done / "DONE").write_text("{}")
    (src / "oracle").mkdir()  # unfinished: no DONE
    (src / "tokenizer.json").write_text("{}")
    (src / "eval" / "base").mkdir(parents=True)
    (src / "eval" / "base" / "summary.json").write_text("{}")
    dst.mkdir()
    linked = link_reused(src, dst, warmup=False)
    assert linked == ["pool", "tokenizer.json", "sft", "eval/base"]
    assert (dst / "sft").resolve() == src / "sft" and (dst / "tokenizer.json").read_text() == "{}"
    assert not (dst / "oracle").exists() and not (dst / "warmup").exists()
    assert link_reused(src, dst) == ["warmup"]  # idempotent; nothing linked twice

    # with this run's config, a trained phase is linked only if its config block matches
    (src / "config.json").write_text(json.dumps({"sft": {"steps": 600}, "warmup": {"steps": 4}}))
    other = tmp_path / "longer_warmup"
    other.mkdir()
    linked = link_reused(src, other, config={"sft": {"steps": 600}, "warmup": {"steps": 16}})
    assert "sft" in linked and "warmup" not in linked and not (other / "warmup").exists()
    same = tmp_path / "same"
    same.mkdir()
    assert "warmup" in link_reused(src, same, config={"sft": {"steps": 600},
                                                      "warmup": {"steps": 4}})

    # what a phase was made from must be reused too: another SFT means no warm-up or SFT
    # evaluation from the source (they were made from its SFT), another pool means nothing
    (src / "eval" / "sft").mkdir(parents=True)
    (src / "eval" / "sft" / "summary.json").write_text("{}")
    other_sft = tmp_path / "other_sft"
    other_sft.mkdir()
    linked = link_reused(src, other_sft, config={"sft": {"steps": 300}, "warmup": {"steps": 4}})
    assert linked == ["pool", "tokenizer.json", "eval/base"]
    other_pool = tmp_path / "other_pool"
    other_pool.mkdir()
    assert link_reused(src, other_pool, config={"seed": 1, "sft": {"steps": 600},
                                                "warmup": {"steps": 4}}) == []


def test_t1_setting_is_the_report_model_on_a_64_gpu_mesh():
    """configs/t1_qwen35_122b.py trains Qwen3.5-122B-A10B (the report's base) with the report's
    fixed choices: R3 and TITO on, dense reward, KL/entropy/load balancing off, oversampling."""
    from t1jax.model.config import model_config_from
    from t1jax.model.sizes import param_counts
    config = importlib.import_module("configs.t1_qwen35_122b").get_config(None)
    cfg = model_config_from(config.model)
    assert cfg.model_type == "qwen3_5_moe_text" and cfg.num_hidden_layers == 48
    assert round(param_counts(cfg)["total"] / 1e9) == 122
    m = config.mesh
    assert m.data * m.fsdp * m.expert * m.tensor == 64 and cfg.num_experts % m.expert == 0
    assert config.rl.r3 and config.rl.reward == "dense"
    assert config.rl.kl_loss_coef == config.rl.entropy_coef == config.rl.load_balancing_coef == 0
    assert config.rollouts.oversample > 1 and config.rollouts.max_turns >= 300


def test_rollout_seeds_come_from_the_run_seed():
    """Unset (-1), a stage's sampling seed is derived from config.seed: a rerun repeats it,
    another config.seed changes it, and Warm-Up and PPO (same first policy) draw apart; a set
    sampling_seed is used as given."""
    from t1jax.jobs.build import rollout_seed
    config = importlib.import_module("configs.tiny_cpu").get_config()
    assert config.rollouts.sampling_seed == -1
    ppo, warm = rollout_seed(config, "ppo"), rollout_seed(config, "critic_warmup")
    assert ppo == rollout_seed(config, "ppo") and ppo != warm and 0 <= ppo < 2**31
    config.seed = 1
    assert rollout_seed(config, "ppo") != ppo
    config.rollouts.sampling_seed = 5
    assert rollout_seed(config, "ppo") == rollout_seed(config, "critic_warmup") == 5


def test_another_evaluation_draw_is_never_paired_with_the_source_run(tmp_path):
    """config.eval.sampling_seed redraws the evaluations of the same policies (the pool stays
    config.seed's): an SFT evaluation of the source is linked only for the same draw, and a
    source whose config.json predates the entry holds the default draw."""
    from t1jax.jobs.recipe import Recipe, link_reused
    from t1jax.rollout.engine import derived_seed
    config = importlib.import_module("configs.tiny_cpu").get_config()
    assert Recipe(config, tmp_path).eval_seed() == derived_seed(config.seed, "eval")
    config.eval.sampling_seed = 7
    assert Recipe(config, tmp_path).eval_seed() == 7

    src = tmp_path / "main"
    for done in ("pool", "sft"):
        (src / done).mkdir(parents=True)
        (src / done / "DONE").write_text("{}")
    (src / "tokenizer.json").write_text("{}")
    (src / "eval" / "sft").mkdir(parents=True)
    (src / "eval" / "sft" / "summary.json").write_text("{}")
    (src / "config.json").write_text(json.dumps({"sft": {"steps": 600},
                                                 "eval": {"attempts": 3}}))  # an older run
    for seed, linked in ((-1, True), (7, False)):
        dst = tmp_path / f"draw{seed}"
        dst.mkdir()
        mine = {"sft": {"steps": 600, "data_seed": -1},
                "eval": {"attempts": 3, "sampling_seed": seed}}
        got = link_reused(src, dst, config=mine)
        assert "sft" in got and ("eval/sft" in got) == linked, (seed, got)


@pytest.mark.parametrize("name", ["oracle", "audit", "synth", "eval", "tiny_cpu"])
def test_every_job_verifies_in_place_by_default_and_refuses_a_wrong_place(name):
    """verifier.where is checked before any job starts (experiments/run.py): a wrong one would
    otherwise fail every trial's verification, one by one, as infrastructure failures."""
    from t1jax.jobs import UsageError, check_verifier
    config = importlib.import_module(f"configs.{name}").get_config(None)
    assert config.verifier.where == "agent"
    check_verifier(config)
    config.verifier.where = "elsewhere"
    with pytest.raises(UsageError, match="config.verifier.where='elsewhere'"):
        check_verifier(config)
    config.verifier.where, config.verifier.mode = "snapshot", "offlin"
    with pytest.raises(UsageError, match="config.verifier.mode='offlin'"):
        check_verifier(config)


@pytest.mark.parametrize("name", sorted(JOB_CONFIGS))
def test_a_variant_a_config_file_lacks_is_an_error_naming_its_variants(name):
    """configs/<file>.py:<arg> with an arg the file does not define never falls back to the
    default silently (configs/oracle.py:offline once did)."""
    with pytest.raises(ValueError, match="no such|has no variant|unknown|variants"):
        importlib.import_module(f"configs.{name}").get_config("no_such_variant")


def test_a_renamed_entry_of_an_older_run_still_compares(tmp_path):
    """rollouts.system_prompt was agent.system_prompt: a finished run recorded under the old
    name is reused by a run with the same prompt under the new one, and not by another."""
    from t1jax.jobs.recipe import link_reused
    src = tmp_path / "old-run"
    for done in ("pool", "oracle"):
        (src / done).mkdir(parents=True)
        (src / done / "DONE").write_text("{}")
    (src / "tokenizer.json").write_text("{}")
    (src / "config.json").write_text(json.dumps({"agent": {"system_prompt": "Use bash."},
                                                 "rollouts": {"tokenizer": ""}}))
    for prompt, linked in (("Use bash.", True), ("Use the shell.", False)):
        dst = tmp_path / f"new-{linked}"
        dst.mkdir()
        mine = {"rollouts": {"system_prompt": prompt, "tokenizer": ""}}
        assert ("tokenizer.json" in link_reused(src, dst, config=mine)) == linked, prompt
