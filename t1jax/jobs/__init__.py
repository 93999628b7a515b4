"""The jobs of experiments/run.py: one module per `mode` (MODES below), each with
`run(config, workdir) -> exit code`, and what the jobs share.

aot.py: ahead-of-time compiles of the trainer's and engine's real-scale steps for a TPU topology,
  on any host, to check sharding, memory and cost without a TPU (the recipe's aot phase).
audit.py: mode `audit`: quality scores and hard rejects for every task of a pool.
build.py: what the jobs build from a config (sandbox backend, task stack, mesh, trainer, restored
  policy, live rollouts), each written once, heavy imports inside the functions.
config_file.py: loads a `get_config(arg)` file by path (`path.py:arg`), for scripts that take a
  config file as a plain argument.
eval.py: mode `eval`: evaluates a policy on a task directory (protocol: t1jax/rollout/evaluate.py).
hlo.py: the collectives a compiled step runs and their bytes, read from HLO text, for aot.py's
  report.
oracle.py: mode `oracle`: validates a task pool with oracle and do-nothing agents.
pool.py: mode `pool`: writes the training pool as a TFDS dataset in quality-rank order, refusing
  a pool that overlaps a held-out suite.
progress.py: progress bars on a terminal and plain progress lines elsewhere (logs, nohup, CI),
  where rich would print nothing until the end.
recipe.py: mode `recipe`: the whole T1 recipe (pool, oracle, SFT, Critic Warm-Up, PPO,
  evaluations, report) at every scale, resuming where it stopped.
synth.py: mode `synth`: grows a task pool by recursive task synthesis.
"""

MODES = {
    "oracle": "t1jax.jobs.oracle",
    "synth": "t1jax.jobs.synth",
    "audit": "t1jax.jobs.audit",
    "pool": "t1jax.jobs.pool",
    "recipe": "t1jax.jobs.recipe",
    "eval": "t1jax.jobs.eval",
}


class UsageError(ValueError):
    """A config value that cannot work; experiments/run.py prints it as a usage error."""


def check_choices(config, choices: dict) -> None:
    """Each dotted config key in `choices` must hold one of its allowed values."""
    for key, allowed in choices.items():
        value = config
        for part in key.split("."):
            value = value[part]
        if value not in allowed:
            raise UsageError(f"config.{key}={value!r}; choose one of {tuple(allowed)}")


def check_verifier(config) -> None:
    """config.verifier's mode and place, checked before any job starts: a wrong one would
    otherwise fail every trial's verification, one by one, as infrastructure failures."""
    if "verifier" not in config:
        return
    from t1jax.verify.verifier import VERIFIER_MODES, VERIFY_WHERE
    check_choices(config, {"verifier.mode": VERIFIER_MODES})
    if "where" in config.verifier:
        check_choices(config, {"verifier.where": VERIFY_WHERE})
