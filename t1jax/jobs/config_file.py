"""Load a `get_config(arg)` file by path, with an optional `path.py:arg` suffix (as absl's
config_flags does), for scripts that take config files as plain arguments."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def load_config_file(spec: str):
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if module_spec is None:
        raise SystemExit(f"not a Python config file: {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)
