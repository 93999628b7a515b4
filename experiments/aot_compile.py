"""Compile a config's training and engine steps for a TPU topology ahead of time, on any host,
and report memory per chip, FLOPs, collectives, estimated step time and MFU (t1jax/jobs/aot.py).

  python -m venv .venv-tpu && .venv-tpu/bin/pip install -r requirements-tpu.txt
  .venv-tpu/bin/python experiments/aot_compile.py --config configs/qwen3_30b_a3b.py \
      --topology v5p:2x4x4 --mesh 1,4,8,1

Exits 1 when a step does not fit in the chip's HBM (the numbers are printed), 2 when libtpu is
missing. --json writes every number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config (trainer fields).")
_TOPOLOGY = flags.DEFINE_string("topology", "v5p:4x4x4", "TPU topology, e.g. v5p:4x4x8.")
_MESH = flags.DEFINE_string("mesh", None, "data,fsdp,expert,tensor (default: the config's).")
_STEPS = flags.DEFINE_list("steps", ["actor", "critic", "prefill", "decode"],
                           "Steps: actor, critic, ppo (both in one program), prefill, decode.")
_MODEL = flags.DEFINE_string("model", None, "A model config file (configs/model/*.py[:arg]) "
                             "whose model block replaces the run config's.")
_ROWS = flags.DEFINE_integer("rows", None, "Training rows (default: one per batch-axis chip per "
                             "minibatch, the smallest batch the trainer packs).")
_LENGTH = flags.DEFINE_integer("length", None, "Tokens per row (default: rl.max_length).")
_PREFILL = flags.DEFINE_integer("prefill", 4096, "Engine prefill tokens per row.")
_ENGINE_ROWS = flags.DEFINE_integer("engine_rows", None, "Engine rows (default: the mesh's "
                                    "batch-axis chips).")
_JSON = flags.DEFINE_string("json", None, "Write the reports here.")


def main(argv) -> int:
    del argv
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required")
    try:
        devices = __import__("t1jax.jobs.aot", fromlist=["aot"]).topology_devices(_TOPOLOGY.value)
    except Exception as err:  # libtpu absent or an unknown topology name
        print(f"cannot describe TPU topology {_TOPOLOGY.value!r} ({type(err).__name__}: {err}). "
              "Ahead-of-time TPU compiles need libtpu: python -m venv .venv-tpu && "
              ".venv-tpu/bin/pip install -r requirements-tpu.txt", file=sys.stderr)
        return 2
    from t1jax import sharding
    from t1jax.jobs import aot
    from t1jax.model.config import model_config_from
    from t1jax.rl.trainer import Settings
    sizes = ([int(x) for x in _MESH.value.split(",")] if _MESH.value else
             [config.mesh.data, config.mesh.fsdp, config.mesh.expert, config.mesh.tensor])
    mesh = sharding.make_mesh(*sizes, devices=devices)
    model = config.model
    if _MODEL.value:
        import importlib.util
        path, _, arg = _MODEL.value.partition(":")
        spec = importlib.util.spec_from_file_location("model_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = module.get_config(arg or None).model
    cfg = aot.for_target(model_config_from(model))
    s = Settings.from_config(config.rl)
    rows = _ROWS.value or aot.rows_per_step(mesh, s)
    length = _LENGTH.value or s.max_length
    batch_chips = sizes[0] * sizes[1] * sizes[2]
    print(f"{len(devices)} x {devices[0].device_kind} ({_TOPOLOGY.value}), mesh "
          f"{dict(mesh.shape)}, model {cfg.model_type} {cfg.num_hidden_layers} layers, "
          f"dispatch {cfg.moe_dispatch}, remat {cfg.remat}, scan_layers {cfg.scan_layers}, "
          f"attention {cfg.attention}, moe_sharding {cfg.moe_sharding}, offload_layer_inputs "
          f"{cfg.offload_layer_inputs}", flush=True)

    def compile_all(model_cfg):
        out = []
        train = [x for x in _STEPS.value if x in ("ppo", "actor", "critic")]
        if train:
            out += aot.train_steps(model_cfg, s, mesh, rows, length, train)
        if {"prefill", "decode"} & set(_STEPS.value):
            engine_rows = _ENGINE_ROWS.value or batch_chips
            out += [r for r in aot.engine_steps(model_cfg, mesh, engine_rows,
                                                min(_PREFILL.value, length), length)
                    if r.name.split()[1] in _STEPS.value]
        return out

    reports = compile_all(cfg)
    for r in reports:
        print("\n".join(r.lines()), flush=True)
    if _JSON.value:
        Path(_JSON.value).write_text(json.dumps({
            "topology": _TOPOLOGY.value, "mesh": dict(mesh.shape), "device": devices[0].device_kind,
            "steps": [r.as_dict() for r in reports]}, indent=2))
    unfit = [r.name for r in reports if not r.fits]
    if unfit:
        print(f"DOES NOT FIT: {unfit}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
