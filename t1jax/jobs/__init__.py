"""One module per `mode` of experiments/run.py; each has `run(config, workdir) -> exit code`.
What they build from a config (sandboxes, task stacks, meshes, trainers, restored policies,
live rollouts) is t1jax.jobs.build's; t1jax.jobs.config_file loads a config file by path for
the scripts that take one as a plain argument."""

MODES = {
    "oracle": "t1jax.jobs.oracle",
    "synth": "t1jax.jobs.synth",
    "audit": "t1jax.jobs.audit",
    "pool": "t1jax.jobs.pool",
    "train": "t1jax.jobs.train",
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
