"""One module per `mode` of experiments/run.py; each has `run(config, workdir) -> exit code`.
What they build from a config (sandboxes, task stacks, meshes, trainers, restored policies,
live rollouts) is t1jax.jobs.build's; t1jax.jobs.config_file loads a config file by path for
the scripts that take one as a plain argument."""

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
