"""Config blocks shared by the jobs: one definition, documented once, with the defaults of the
code that reads them (Limits, Settings, EpisodeSettings, FleetClient) taken from there, so a
config file sets only what differs (tests/jobs/test_configs.py fails on a restated value)."""

import ml_collections

from t1jax.sandbox.base import Limits


def check_variant(config_file: str, arg: str | None, variants=()) -> None:
    """A named variant (`--config configs/<file>.py:<arg>`) the file does not define is an
    error naming the ones it does, never silently the default."""
    if arg and arg not in variants:
        raise ValueError(f"configs/{config_file}.py has no variant {arg!r}"
                         + (f" (variants: {', '.join(variants)})" if variants
                            else " (it takes none)"))


def _default(code, name: str):
    """The default of `code`'s parameter or dataclass field `name`: written there, once."""
    import dataclasses
    import inspect
    if dataclasses.is_dataclass(code):
        return next(f.default for f in dataclasses.fields(code) if f.name == name)
    return inspect.signature(code).parameters[name].default


def sandbox_config() -> ml_collections.ConfigDict:
    from t1jax.rollout.trial import TrialSite
    sandbox = ml_collections.ConfigDict()
    sandbox.backend = "docker"  # docker | bwrap (no daemon needed)
    sandbox.concurrency = _default(TrialSite, "concurrency")  # sandboxes running at once
    sandbox.allow_network = False  # a task's allow_internet only counts when this is True
    sandbox.runtime = ""  # Docker runtime: "" (the daemon's default, runc) | runc | runsc (gVisor)
    sandbox.build_network = "none"  # network for `docker build` (host to apt-get in builds)
    # public base -> local image, over t1jax.sandbox.images.DEFAULT_BASE_MAP (Docker only):
    # "python:3.12-slim=t1jax/base:bookworm,node:20=my/node:20"; "*=IMAGE" maps every other base
    sandbox.base_map = ""
    # True where the registry is reachable (Harbor's way): a task's prebuilt docker_image is
    # pulled and used, missing bases are pulled; False: Dockerfiles built on local stand-ins
    sandbox.registry = False
    # per command output kept (head + tail), command timeout, all of an episode's output:
    # the defaults of t1jax.sandbox.base.Limits, written there once
    sandbox.pids = Limits.pids
    sandbox.max_output_bytes = Limits.max_output_bytes
    sandbox.command_timeout_s = Limits.default_timeout_s
    sandbox.episode_output_bytes = Limits.episode_output_bytes
    return sandbox


def verifier_config() -> ml_collections.ConfigDict:
    """How trials are verified and scored (every job that verifies reads this block)."""
    verifier = ml_collections.ConfigDict()
    verifier.mode = "script"  # script | offline | pytest (t1jax/verify/verifier.py)
    # agent: in the agent's own sandbox once it finished, as Harbor does (services it started
    # still running); snapshot: in a fresh sandbox from a snapshot of its files (nothing it
    # left running can touch the tests, no process survives; a docker commit per trial)
    verifier.where = "agent"
    verifier.global_scale = 0.0  # > 0 fixes the dense reward's denominator
    verifier.scale_quantile = 0.9  # else: this quantile of the pool's assertion counts
    return verifier


def rl_config() -> ml_collections.ConfigDict:
    """PPO's settings at their defaults, made from t1jax.rl.trainer.Settings: what each knob
    means and its default are written there, once."""
    import dataclasses

    from t1jax.rl.trainer import Settings
    return ml_collections.ConfigDict(dataclasses.asdict(Settings()))


def llm_config() -> ml_collections.ConfigDict:
    """An OpenAI-compatible chat server (synthesis's rewriter, the audit's judge), at the
    defaults of t1jax.curation.llm.LLMConfig."""
    from t1jax.curation.llm import LLMConfig
    default = LLMConfig()
    llm = ml_collections.ConfigDict()
    llm.base_url = default.base_url  # e.g. http://127.0.0.1:30000; "": off
    llm.model = default.model
    llm.temperature = default.temperature
    llm.max_tokens = default.max_tokens
    llm.timeout_s = default.timeout_s
    llm.api_key_env = ""  # the environment variable holding the API key, if the server needs one
    return llm


def rollouts_config() -> ml_collections.ConfigDict:
    """How trials are rolled out, in every job that plays episodes (the recipe, eval): the
    engine, the tokenizer and tool format, and the episode's knobs, at the defaults of
    t1jax.rollout.settings.EpisodeSettings (built from this block by t1jax/jobs/build.py
    episode_settings) and of the fleet client."""
    from t1jax.rollout.settings import EpisodeSettings
    from t1jax.rollout.sglang import FleetClient
    r = ml_collections.ConfigDict()
    r.engine = "embedded"  # embedded (in-process JAX) | fleet (SGLang-API servers)
    r.engine_batch = 8  # sequences the embedded engine decodes together
    r.fleet_urls = ""  # comma-separated SGLang / t1jax server urls (fleet)
    # an SGLang model gateway in front of them (smg >= 1.13, --policy consistent_hashing):
    # generation goes through it, weights are published to every fleet_urls server
    r.fleet_router = ""
    r.fleet_timeout_s = _default(FleetClient, "timeout_s")  # per HTTP call to a fleet server
    r.fleet_retries = _default(FleetClient, "retries")  # extra tries on other servers on failure
    r.tokenizer = ""  # tokenizer.json (the model's own); "": the job's default
    # qwen3_json | qwen3_xml; "": the checkpoint's (init.hf_path) or tokenizer folder's chat
    # template says (t1jax/rollout/chat.py), else qwen3_json
    r.tool_format = ""
    r.system_prompt = ""  # "": the harness's own
    r.max_turns = EpisodeSettings.max_turns
    r.max_new_tokens = EpisodeSettings.max_new_tokens  # per turn
    r.tito = EpisodeSettings.tito  # False: the text round trip of configs/ablations.py:no_tito
    return context_config(r)


def eval_config() -> ml_collections.ConfigDict:
    """How a policy is evaluated, in both jobs that evaluate (the recipe's base / SFT / PPO
    evaluations, the eval job): k attempts per task at one temperature, seeded."""
    from t1jax.rollout.evaluate import evaluate
    from t1jax.rollout.settings import EpisodeSettings
    e = ml_collections.ConfigDict()
    e.attempts = _default(evaluate, "attempts")  # trials per task; pass@k for k = 1..attempts
    e.temperature = EpisodeSettings.temperature
    e.top_p = EpisodeSettings.top_p  # >= 1: no nucleus truncation
    e.timeout_s = 0.0  # per trial wall clock; 0: the task's [agent] timeout_sec
    e.sampling_seed = -1  # -1: derived from config.seed (the recipe's base / SFT / PPO share it)
    return e


def context_config(rollouts: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Context management for episodes longer than one context window
    (t1jax/rollout/context.py); "none" keeps one chunk as long as the trial (rl.max_length).
    A policy's knobs take ContextPolicy's defaults."""
    import dataclasses

    from t1jax.rollout.context import ContextPolicy
    policy = {f.name: f.default for f in dataclasses.fields(ContextPolicy)}
    rollouts.compaction = "none"  # none | stop | elide | summary
    # tokens per trial, all chunks together (0: rl.max_length, one training row); larger needs a
    # compaction policy, and the trainer then splits a trial over rows at chunk boundaries
    rollouts.trial_tokens = 0
    rollouts.context_tokens = 0  # tokens per chunk (0: the model's positions, the engine's cache)
    rollouts.compaction_reserve = policy["reserve"]  # free tokens a turn needs (0: automatic)
    rollouts.keep_observations = policy["keep_observations"]  # elide: newest outputs kept whole
    # elide: replayed turns' share of the room after the prompt
    rollouts.replay_fraction = policy["replay_fraction"]
    rollouts.summary_tokens = policy["summary_tokens"]  # summary: the summary reply's budget
    return rollouts
