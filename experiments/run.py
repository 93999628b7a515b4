"""The one entry point: `python experiments/run.py --config configs/<name>.py [--config.x=y]`.

Each config names a `mode`; its job lives in t1jax/jobs/<mode>.py (see t1jax.jobs.MODES).
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import signal
import sys
from pathlib import Path

import jax
from absl import app, flags, logging
from ml_collections import config_flags

# t1jax is an installed project (pip install -e ., which scripts/setup.sh runs): say so plainly
if importlib.util.find_spec("t1jax") is None or importlib.util.find_spec("configs") is None:
    sys.exit(f"t1jax is not installed in this Python ({sys.executable}): run `bash "
             f"scripts/setup.sh` or `pip install -e .` in {Path(__file__).resolve().parents[1]}")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default runs/<mode>).")


def _interrupt_on_sigterm() -> None:
    """SIGTERM (a scheduler's kill) unwinds like Ctrl-C, so every sandbox is removed. SIGINT
    too, even when the job was started in the background (`cmd &` in a script), which passes
    SIGINT on ignored: `kill -INT` must still stop it cleanly."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv) -> None:
    _interrupt_on_sigterm()
    # `kill -USR1 <pid>` prints every thread's stack (to stderr) and goes on: where a hung
    # process waits (experiments/launch_local.py sends it to a job past its timeout)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from t1jax import distributed
    # before any device is touched: a process outside the job would build its own small mesh
    multi = distributed.initialize()
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config configs/oracle.py")
    from t1jax.jobs import MODES
    if config.mode not in MODES:
        raise app.UsageError(f"unknown mode {config.mode!r} in the config; known: {sorted(MODES)}")
    if multi and config.mode != "recipe":
        raise app.UsageError(f"mode {config.mode!r} runs as one process; a multi-process job "
                             "runs the recipe (configs/tiny_cpu.py, the real-scale configs)")
    workdir = Path(_WORKDIR.value or os.path.join("runs", config.mode)).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if not multi or distributed.is_main():  # (a single process touches no device here)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    if multi:
        logging.info("process %d of %d, %d of %d devices here", distributed.process_index(),
                     distributed.process_count(), len(jax.local_devices()), len(jax.devices()))

    from t1jax.jobs import UsageError, check_verifier
    try:
        check_verifier(config)
        code = importlib.import_module(MODES[config.mode]).run(config, workdir)
    except UsageError as err:
        raise app.UsageError(str(err)) from err
    sys.exit(code)


if __name__ == "__main__":
    app.run(main)
