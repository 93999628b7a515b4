"""Ahead-of-time compilation of the real-scale steps for a TPU topology, from any host.

Why: nobody needs a TPU to learn whether a config's sharding is valid, whether its steps fit in
HBM, and what they cost; `jax[tpu]`'s libtpu compiles for a named topology on a CPU machine
(MaxText checks its configs the same way). Everything is abstract: parameters, optimizer state,
batches and caches are ShapeDtypeStructs carrying their shardings, so a 235B model costs no
memory here. The steps compiled are exactly the trainer's (`trainer.ppo_step`, `critic_step`)
and the embedded engine's (`jax_engine._prefill`, `_decode`), with the config's mesh and rules.

The report per step: memory per chip from XLA's buffer assignment (arguments, outputs,
temporaries, total against the chip's HBM), FLOPs and bytes from XLA's cost analysis (which
counts a loop body once: scans over minibatches, token chunks and attention blocks make it an
undercount), the collectives in the compiled HLO (count and bytes, loop bodies multiplied by
their trip counts: t1jax/jobs/hlo.py), and an estimated step time and MFU: the model's FLOPs
(t1jax.model.sizes.param_counts, plus attention) with the remat recompute at the chip's peak,
or XLA's bytes at its HBM bandwidth, whichever is slower, plus every collective byte over the
chip's ICI bandwidth with no overlap. Peak-rate matmuls make the MFU an upper bound.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from t1jax import sharding
from t1jax.jobs.hlo import collectives
from t1jax.model.cache import KVCache
from t1jax.model.config import ModelConfig
from t1jax.model.dispatch import resolve_strategy
from t1jax.model.sizes import param_counts
from t1jax.model.transformer import CausalLM, ValueModel
from t1jax.rl import trainer as trainer_lib
from t1jax.rl.batch import Batch, batch_shardings


@dataclasses.dataclass(frozen=True)
class Chip:
    hbm_bytes: float
    peak_flops: float  # bf16 dense
    hbm_bandwidth: float  # bytes/s
    ici_bandwidth: float  # bytes/s per chip, all links together


# Public spec sheets (cloud.google.com/tpu/docs/<version>). HBM is in GiB there: v5p's sheet
# lists 95 GiB, what a program may allocate of the chip's 96 GiB (libtpu's own out-of-memory
# message says 95.74G available), so 95 GiB = 102.0e9 bytes, not 95e9.
GIB = 2**30
CHIPS = {
    "TPU v4": Chip(32 * GIB, 275e12, 1.2e12, 2400e9 / 8),
    "TPU v5 lite": Chip(16 * GIB, 197e12, 819e9, 1600e9 / 8),
    "TPU v5": Chip(95 * GIB, 459e12, 2.765e12, 4800e9 / 8),  # v5p's device_kind
    "TPU v6 lite": Chip(32 * GIB, 918e12, 1.64e12, 3584e9 / 8),
}


def chip_spec(device_kind: str) -> Chip:
    if device_kind not in CHIPS:
        raise ValueError(f"no spec sheet for {device_kind!r}; known: {sorted(CHIPS)}")
    return CHIPS[device_kind]


def topology_devices(topology: str):
    """The devices of a TPU topology such as "v5p:4x4x8" (needs libtpu: `jax[tpu]`)."""
    import os
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # not on a TPU VM: no metadata server
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no chip to guard
    from jax.experimental import topologies
    return topologies.get_topology_desc(topology_name=topology, platform="tpu").devices


def for_target(cfg: ModelConfig, platform: str = "tpu") -> ModelConfig:
    """The model config as it would run on `platform` ("auto" dispatch resolves for it)."""
    return cfg.replace(moe_dispatch=resolve_strategy(cfg.moe_dispatch, platform))


# -- abstract inputs -------------------------------------------------------------------------------

def _abstract(tree, shardings):
    """ShapeDtypeStructs carrying `shardings` (a tree like `tree`, or with NamedShardings where
    `tree` has nnx Variables, as sharding.shardings gives)."""
    def one(x, s):
        if isinstance(s, nnx.Variable):
            s = s.get_value()
        if isinstance(x, nnx.Variable):
            v = x.get_value()
            return x.replace(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    return jax.tree.map(one, tree, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _param_state(module_cls, cfg, mesh, rules):
    return sharding.abstract_state(lambda: module_cls(cfg, nnx.Rngs(0)), mesh, rules, nnx.Param)


def train_state(cfg: ModelConfig, s: trainer_lib.Settings, mesh, rules=None):
    """(actor graphdef, critic graphdef, optimizers, abstract TrainState placed as the
    Trainer places it: parameters by the rules, optimizer moments like their parameters,
    counters replicated)."""
    actor_def, actor, actor_sh = _param_state(CausalLM, cfg, mesh, rules)
    critic_def, critic, critic_sh = _param_state(ValueModel, cfg, mesh, rules)
    actor_tx = trainer_lib.make_optimizer(s.actor_lr, s)
    critic_tx = trainer_lib.make_optimizer(s.critic_lr, s)
    init = functools.partial(trainer_lib.init_train_state, actor_tx, critic_tx, s)
    actor, critic = _abstract(actor, actor_sh), _abstract(critic, critic_sh)
    out_sh = trainer_lib.train_state_shardings(init, actor, critic, actor_tx, critic_tx, mesh)
    shape = jax.eval_shape(init, actor, critic)
    return actor_def, critic_def, actor_tx, critic_tx, _abstract(shape, out_sh)


def batch(cfg: ModelConfig, rows: int, length: int, mesh, rules=None) -> Batch:
    """An abstract training batch of `rows` x `length` tokens, placed as shard_batch places it."""
    k, layers = cfg.num_experts_per_tok, cfg.num_hidden_layers
    i32, f32 = jnp.int32, jnp.float32
    shapes = Batch(*(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (
        ((rows, length), i32), ((rows, length), i32), ((rows, length), i32),
        ((rows, length), i32), ((rows, length), f32), ((rows, length), f32),
        ((rows, length, layers, k), i32), ((rows, length), f32), ((rows, length), i32),
        ((rows, length), f32))))
    return _abstract(shapes, batch_shardings(shapes, mesh, rules))


# -- compile and measure ---------------------------------------------------------------------------

def model_flops(cfg: ModelConfig, tokens: int, context: int, passes: float) -> float:
    """Matmul FLOPs of `passes` forward-equivalents (fwd = 1, fwd + bwd = 3) over `tokens`
    tokens, each attending to `context` keys on average: 2 * active parameters per token (the
    embedding lookup is not a matmul) + 4 * context * heads * head_dim per full-attention layer
    (Gated DeltaNet layers count their projections only)."""
    counts = param_counts(cfg)
    matmul = counts["active"] - counts["embedding"] + (counts["embedding"] if cfg.tie_word_embeddings
                                                       else 0)
    attention = 4 * context * cfg.num_attention_heads * cfg.head_dim * len(cfg.attention_layers)
    return passes * tokens * (2 * matmul + attention)


@dataclasses.dataclass
class StepReport:
    name: str
    compile_s: float
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    xla_flops: float
    xla_bytes: float
    model_flops: float  # per chip
    hardware_flops: float  # per chip, with the remat recompute
    collectives: dict
    chip: Chip
    error: str = ""  # the compiler's whole out-of-memory message
    kind: str = ""  # actor | critic | ppo | prefill | decode
    # host memory (pinned_host) the step's temporaries take: offloaded layer inputs
    # (ModelConfig.offload_layer_inputs); not HBM, and its copies are not in step_seconds
    host_temp_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def fits(self) -> bool:
        return not self.error and self.total_bytes <= self.chip.hbm_bytes

    @property
    def collective_bytes(self) -> float:
        return sum(c["bytes"] for c in self.collectives.values())

    @property
    def step_seconds(self) -> float:
        compute = max(self.hardware_flops / self.chip.peak_flops,
                      self.xla_bytes / self.chip.hbm_bandwidth)
        return compute + self.collective_bytes / self.chip.ici_bandwidth

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_seconds * self.chip.peak_flops)

    def as_dict(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "chip"}
        d.update(total_bytes=self.total_bytes, hbm_bytes=self.chip.hbm_bytes, fits=self.fits,
                 step_seconds=self.step_seconds, mfu=self.mfu)
        return d

    def lines(self) -> list[str]:
        gb = 1e9
        if self.error:
            first, *rest = self.error.splitlines()
            return ([f"{self.name}: DOES NOT FIT: {first} (after {self.compile_s:.0f} s)"]
                    + [f"  {line}" for line in rest[:40] if line.strip()])
        out = [f"{self.name}: {self.total_bytes / gb:.1f} GB of {self.chip.hbm_bytes / gb:.1f} GB "
               f"({self.chip.hbm_bytes / GIB:.0f} GiB) per chip ({'fits' if self.fits else 'DOES NOT FIT'}): arguments "
               f"{self.argument_bytes / gb:.1f}, outputs {self.output_bytes / gb:.1f} (aliased "
               f"{self.alias_bytes / gb:.1f}), temporaries {self.temp_bytes / gb:.1f}"
               + (f", host {self.host_temp_bytes / gb:.1f}" if self.host_temp_bytes else "")
               + f"; compiled in {self.compile_s:.0f} s",
               f"  FLOPs/chip: model {self.model_flops:.3g}, with recompute "
               f"{self.hardware_flops:.3g} (XLA cost analysis, loop bodies once: "
               f"{self.xla_flops:.3g} FLOPs, {self.xla_bytes:.3g} bytes); estimated "
               f"{self.step_seconds:.2f} s, MFU <= {100 * self.mfu:.1f}%"]
        out.append("  collectives/chip: " + ", ".join(
            f"{k} {c['count']}x {c['bytes'] / gb:.2f} GB" for k, c in self.collectives.items()
            if c["count"]))
        return out


def measure(name: str, lowered, flops: tuple[float, float], chip: Chip,
            kind: str = "") -> StepReport:
    """Compile `lowered`; flops = (model, with recompute) per chip."""
    import time
    t0 = time.perf_counter()
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as err:  # XLA refuses a program over the chip's HBM
        found = re.search(r"HLO temporaries \(([\d.]+)G\)", str(err))
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        temp = int(float(found.group(1)) * 2**30) if found else 0
        return StepReport(name, time.perf_counter() - t0, 0, 0, 0, temp, 0.0, 0.0,
                          *flops, {}, chip, str(err)[:8000], kind)
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    return StepReport(name, seconds, mem.argument_size_in_bytes, mem.output_size_in_bytes,
                      mem.alias_size_in_bytes, mem.temp_size_in_bytes,
                      float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
                      *flops, collectives(compiled.as_text()), chip, kind=kind,
                      host_temp_bytes=int(getattr(mem, "host_temp_size_in_bytes", 0) or 0))


# -- the steps ---------------------------------------------------------------------------------

def train_steps(cfg: ModelConfig, s: trainer_lib.Settings, mesh, rows: int, length: int,
                steps=("actor", "critic"), rules=None, chip: Chip | None = None):
    """Compile trainer steps for one batch of rows x length: "actor" (trainer.actor_step: the
    actor's half of a PPO step, advantages given), "critic" (trainer.critic_step: the critic's
    half, which is also Critic Warm-Up's step), "ppo" (both in one program, as the trainer
    runs it; about twice the compile time and host memory)."""
    chip = chip or chip_spec(mesh.devices.flat[0].device_kind)
    actor_def, critic_def, actor_tx, critic_tx, state = train_state(cfg, s, mesh, rules)
    data = batch(cfg, rows, length, mesh, rules)
    data_sh = jax.tree.map(lambda x: x.sharding, data)
    state_sh = jax.tree.map(lambda x: x.sharding, state)
    tokens, context = rows * length, length / 2  # causal: a token sees half the row on average
    # forward-equivalents per model: pre-update forward 1 + update 3 (fwd + bwd); remat
    # recomputes the forward once more in the backward
    per_model, recompute = 4, 1 if cfg.remat else 0
    advantages = jax.ShapeDtypeStruct((rows, length), jnp.float32, sharding=data_sh.loss_mask)
    fns = {
        "ppo": (functools.partial(trainer_lib.ppo_step, actor_def, critic_def, actor_tx,
                                  critic_tx, s), 2, ()),
        "actor": (functools.partial(trainer_lib.actor_step, actor_def, actor_tx, s), 1,
                  (advantages,)),
        "critic": (functools.partial(trainer_lib.critic_step, critic_def, critic_tx, s), 1, ()),
    }
    reports = []
    for name in steps:
        fn, models, extra = fns[name]
        with jax.set_mesh(mesh):
            lowered = jax.jit(
                fn, in_shardings=(state_sh, data_sh) + tuple(x.sharding for x in extra),
                out_shardings=(state_sh, None), donate_argnums=(0,)).lower(state, data, *extra)
        flops = tuple(model_flops(cfg, tokens, context, models * p) / mesh.size
                      for p in (per_model, per_model + recompute))
        reports.append(measure(f"{name} step ({rows} x {length} tokens)", lowered, flops, chip,
                               name))
    return reports


def engine_steps(cfg: ModelConfig, mesh, batch_size: int, prefill: int, max_len: int,
                 rules=None, chip: Chip | None = None):
    """Compile the embedded engine's prefill (`prefill` new tokens per row into a cache of
    `max_len`) and decode (one token per row) for `batch_size` rows, weights sharded by the
    rules, rows over the batch axes."""
    from t1jax.rollout import jax_engine
    chip = chip or chip_spec(mesh.devices.flat[0].device_kind)
    graphdef, params, params_sh = _param_state(CausalLM, cfg, mesh, rules)
    shape = dict(mesh.shape)

    def place(x, names):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
            mesh, sharding.spec_for(names, x.shape, shape, rules)))

    cache = jax.eval_shape(lambda: KVCache.create(cfg, batch_size, max_len))
    names = {4: ("batch", None, "kv_heads", "head_dim"), 3: ("batch", None, None),
             1: ("batch",)}
    cache = jax.tree.map(lambda x: place(x, names.get(x.ndim, ("batch",) + (None,) * (x.ndim - 1))),
                         cache)
    state = _abstract(params, params_sh)
    vec = lambda dtype: place(jax.ShapeDtypeStruct((batch_size,), dtype), ("batch",))  # noqa: E731
    sampling = (vec(jnp.float32), vec(jnp.int32), vec(jnp.float32), vec(jnp.uint32),
                vec(jnp.int32))
    row = lambda n: place(jax.ShapeDtypeStruct((batch_size, n), jnp.int32), ("batch", None))  # noqa: E731
    reports = []
    with jax.set_mesh(mesh):
        lowered = jax_engine._prefill.lower(graphdef, state, cache, row(prefill), row(prefill),
                                            vec(jnp.bool_), vec(jnp.int32), vec(jnp.int32),
                                            sampling)
    flops = (model_flops(cfg, batch_size * prefill, max_len / 2, 1) / mesh.size,) * 2
    reports.append(measure(f"engine prefill ({batch_size} x {prefill} tokens, cache {max_len})",
                           lowered, flops, chip, "prefill"))
    with jax.set_mesh(mesh):
        lowered = jax_engine._decode.lower(graphdef, state, cache, vec(jnp.int32), vec(jnp.int32),
                                           vec(jnp.bool_), sampling)
    flops = (model_flops(cfg, batch_size, max_len / 2, 1) / mesh.size,) * 2
    reports.append(measure(f"engine decode ({batch_size} rows, cache {max_len})", lowered, flops,
                           chip, "decode"))
    return reports


def rows_per_step(mesh, s: trainer_lib.Settings) -> int:
    """The smallest batch the trainer packs: one row per batch-axis device per minibatch."""
    shape = dict(mesh.shape)
    return shape["data"] * shape["fsdp"] * shape["expert"] * s.minibatches



def check(config, workdir) -> int:
    """The recipe's `aot` phase (`--config.phases=aot`, under .venv-tpu): the run config's
    steps compiled for `config.aot.topology` with its mesh, the reports printed and written to
    `<workdir>/aot/report.json`; 1 when a step does not fit in HBM, 2 when libtpu cannot
    describe the topology. Why in the recipe: the check compiles what the run itself would
    (its model, rl settings and mesh rules), from the one driver the run uses."""
    import json
    import sys
    from pathlib import Path

    from t1jax.model.config import model_config_from
    a = config.aot
    try:
        devices = topology_devices(a.topology)
    except Exception as err:  # libtpu absent or an unknown topology name
        print(f"config.aot.topology={a.topology!r}: cannot describe it ({type(err).__name__}: "
              f"{err}). Ahead-of-time TPU compiles need libtpu: python -m venv .venv-tpu && "
              ".venv-tpu/bin/pip install -r requirements-tpu.txt, then run this command with "
              ".venv-tpu/bin/python", file=sys.stderr)
        return 2
    sizes = ([int(x) for x in a.mesh.split(",")] if a.mesh else
             [config.mesh.data, config.mesh.fsdp, config.mesh.expert, config.mesh.tensor])
    mesh = sharding.make_mesh(*sizes, devices=devices)
    model = config.model
    if a.model:  # another model on the same run settings
        import importlib.util
        path, _, arg = a.model.partition(":")
        spec = importlib.util.spec_from_file_location("model_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = module.get_config(arg or None).model
    cfg = for_target(model_config_from(model))
    s = trainer_lib.Settings.from_config(config.rl)
    rows, length = a.rows or rows_per_step(mesh, s), a.length or s.max_length
    steps = [x for x in a.steps.split(",") if x]
    unknown = sorted(set(steps) - {"actor", "critic", "ppo", "prefill", "decode"})
    if unknown:
        raise ValueError(f"config.aot.steps names unknown steps {unknown}; known: actor, "
                         "critic, ppo, prefill, decode")
    print(f"{len(devices)} x {devices[0].device_kind} ({a.topology}), mesh {dict(mesh.shape)}, "
          f"model {cfg.model_type} {cfg.num_hidden_layers} layers, dispatch {cfg.moe_dispatch}, "
          f"remat {cfg.remat}, scan_layers {cfg.scan_layers}, attention {cfg.attention}, "
          f"moe_sharding {cfg.moe_sharding}, offload_layer_inputs {cfg.offload_layer_inputs}",
          flush=True)
    reports = []
    train = [x for x in steps if x in ("ppo", "actor", "critic")]
    if train:
        reports += train_steps(cfg, s, mesh, rows, length, train)
    if {"prefill", "decode"} & set(steps):
        engine_rows = a.engine_rows or sizes[0] * sizes[1] * sizes[2]
        reports += [r for r in engine_steps(cfg, mesh, engine_rows, min(a.prefill, length),
                                            length) if r.kind in steps]
    for r in reports:
        print("\n".join(r.lines()), flush=True)
    out = Path(workdir) / "aot"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({
        "topology": a.topology, "mesh": dict(mesh.shape), "device": devices[0].device_kind,
        "hosts": len({d.process_index for d in devices}),
        "steps": [r.as_dict() for r in reports]}, indent=2))
    unfit = [r.name for r in reports if not r.fits]
    if unfit:
        print(f"DOES NOT FIT: {unfit}", file=sys.stderr)
        return 1
    return 0
