"""Mesh construction and the one rules table mapping logical axis names to mesh axes.

Model code names axes logically ('embed', 'expert', ...); only this table knows the mesh
(data, fsdp, expert, tensor). A dimension that a mesh axis does not divide stays replicated
rather than failing, so one table serves every mesh from 1 CPU to a TPU pod.
"""

from __future__ import annotations

import contextlib
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "expert", "tensor")
RULES = (
    ("batch", ("data", "fsdp", "expert")),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("linear_k_heads", "tensor"),
    ("linear_v_heads", "tensor"),
    ("conv", None),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert", "expert"),
    ("expert_mlp", "tensor"),
    ("norm", None),
)
_active_rules = [RULES]


def make_mesh(data: int = 1, fsdp: int = 1, expert: int = 1, tensor: int = 1,
              devices=None) -> Mesh:
    """A (data, fsdp, expert, tensor) mesh over `devices` (default: all)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = (data, fsdp, expert, tensor)
    if math.prod(sizes) != len(devices):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                         f"have {len(devices)}")
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def mesh_from_config(mesh_config, devices=None) -> Mesh:
    return make_mesh(mesh_config.data, mesh_config.fsdp, mesh_config.expert,
                     mesh_config.tensor, devices)


@contextlib.contextmanager
def use_rules(rules):
    _active_rules.append(tuple(rules))
    try:
        yield
    finally:
        _active_rules.pop()


def spec_for(names, shape, mesh_shape: dict, rules=None) -> P:
    """PartitionSpec for an array with logical `names` (None = replicated dim). A mesh axis is
    used at most once per array, and only where it divides the dimension."""
    names, shape = tuple(names), tuple(shape)
    if len(names) > len(shape):  # zip would silently drop names: a caller's rank bug
        raise ValueError(f"{len(names)} logical names {names} for an array of shape {shape}")
    table = dict(_active_rules[-1] if rules is None else rules)
    used, spec = set(), []
    for name, dim in zip(names, shape):
        target = table.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        kept = []
        for axis in axes:
            size = mesh_shape.get(axis, 1)
            if axis in used or axis in kept or size == 1:
                continue
            if dim % (math.prod(mesh_shape[a] for a in kept) * size) == 0:
                kept.append(axis)
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*spec)


def constrain(x: jax.Array, names) -> jax.Array:
    """with_sharding_constraint by logical names under an active mesh (`jax.set_mesh`)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, spec_for(names, x.shape, dict(mesh.shape)))


def param_specs(state, mesh: Mesh, rules=None):
    """PartitionSpecs for an nnx state whose Params carry logical axis names."""
    from flax import nnx
    logical = nnx.get_partition_spec(state)
    shape = dict(mesh.shape)

    def one(spec_var, value_var):
        names = tuple(spec_var.get_value() if hasattr(spec_var, "get_value") else spec_var)
        value = value_var.get_value() if hasattr(value_var, "get_value") else value_var
        return spec_for(names, value.shape, shape, rules)

    return jax.tree.map(one, logical, state, is_leaf=lambda v: isinstance(v, nnx.Variable))


def shardings(specs, mesh: Mesh):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda s: isinstance(s, P))


def abstract_state(build, mesh: Mesh, rules=None, *filters):
    """(graphdef, abstract state, its shardings by the rules) of the nnx module `build()`
    returns, nothing allocated; filters select the state as nnx.split does."""
    from flax import nnx
    graphdef, state = nnx.split(nnx.eval_shape(build), *filters)
    return graphdef, state, shardings(param_specs(state, mesh, rules), mesh)


def create_sharded(build, mesh: Mesh, rules=None):
    """Build an nnx module with every parameter created already sharded: `build()` runs under
    jax.jit with out_shardings from the rules, so no host ever holds the whole model."""
    from flax import nnx
    graphdef, _, out = abstract_state(build, mesh, rules)
    init = jax.jit(lambda: nnx.split(build())[1], out_shardings=out)
    with jax.set_mesh(mesh):
        state = init()
    return nnx.merge(graphdef, state)
