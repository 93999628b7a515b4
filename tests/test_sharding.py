"""t1jax.sharding on 8 host CPU devices (tests/conftest.py forces them): the sharded model
computes what the single-device model computes, experts really live on the `expert` axis, large
parameters are never fully replicated under fsdp, gradients match, and the rules table resolves
logical names to mesh axes as documented (each mesh axis once per array, non-dividing axes
left out, several axes composed for one dim)."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from t1jax import sharding
from t1jax.model.config import model_config_from
from t1jax.model.transformer import CausalLM

ROOT = Path(__file__).resolve().parents[1]
MESHES = [(8, 1, 1, 1), (2, 2, 2, 1), (1, 2, 4, 1), (2, 1, 2, 2)]
MIB = 1 << 20
B, S = 8, 16  # B divisible by data * fsdp * expert of every mesh above
# Test-only: skip LLVM's expensive passes, ~40% less compile time on the 2-core CPU box; the
# numerics checked here do not depend on them (they only change code generation).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")


def tiny_config(**kw):
    spec = importlib.util.spec_from_file_location("tiny", ROOT / "configs" / "model" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    small = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_hidden_layers=2, mlp_only_layers=(0,), num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                 param_dtype="float32", compute_dtype="float32")
    small.update(kw)
    return model_config_from(module.get_config().model).replace(**small)


def named(mesh, names, shape):
    return NamedSharding(mesh, sharding.spec_for(names, shape, dict(mesh.shape)))


def tokens_for(cfg, seed=1):
    return jax.random.randint(jax.random.key(seed), (B, S), 0, cfg.vocab_size, jnp.int32)


def on_one_device(state):
    """The same parameter values, gathered to the host and put on a single device."""
    return jax.device_put(jax.device_get(state), jax.devices()[0])


def forward_fn(graphdef):
    def forward(state, tokens):
        out = nnx.merge(graphdef, state)(tokens)
        return out.logits, out.routes
    return forward


def loss_fn(graphdef):
    """Mean next-token cross-entropy over the LM logits plus 0.01 x the MoE aux loss (so the
    router gets gradient through both the gate weights and the load-balancing term)."""
    def loss(state, tokens):
        out = nnx.merge(graphdef, state)(tokens)
        logits = out.logits[:, :-1].astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(nll) + 0.01 * out.aux_loss
    return loss


def expert_params(state):
    """(path, Variable) of every MoE expert weight ([E, ...] gate/up/down)."""
    out = []
    for path, var in nnx.to_flat_state(state):
        if "mlp" in path and path[-1] in ("gate", "up", "down") and var.get_value().ndim == 3:
            out.append((path, var))
    return out


# -- the sharded model equals the single-device model ---------------------------------------------

CFG = tiny_config(tie_word_embeddings=False)  # an lm_head, as the real Qwen3-MoE checkpoints
_MODELS = {}  # (config, mesh shape) -> (mesh, graphdef, state): each compiled init built once


def sharded_model(shape, cfg=CFG):
    if (cfg, shape) not in _MODELS:
        mesh = sharding.make_mesh(*shape)
        model = sharding.create_sharded(lambda: CausalLM(cfg, nnx.Rngs(0)), mesh)
        _MODELS[cfg, shape] = (mesh, *nnx.split(model))
    return _MODELS[cfg, shape]


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.slow
def test_sharded_forward_matches_single_device(shape):
    cfg = CFG
    mesh, graphdef, state = sharded_model(shape)
    state_shardings = sharding.shardings(sharding.param_specs(state, mesh), mesh)
    k, layers = cfg.num_experts_per_tok, cfg.num_hidden_layers
    tok_s = named(mesh, ("batch", "length"), (B, S))
    logits_s = named(mesh, ("batch", "length", "vocab"), (B, S, cfg.vocab_size))
    routes_s = named(mesh, ("batch", "length", None, None), (B, S, layers, k))
    assert tok_s.spec[0] is not None  # the batch really is split
    tokens = tokens_for(cfg)

    forward = jax.jit(forward_fn(graphdef), in_shardings=(state_shardings, tok_s),
                      out_shardings=(logits_s, routes_s), compiler_options=FAST_COMPILE)
    with jax.set_mesh(mesh):
        logits, routes = forward(state, jax.device_put(tokens, tok_s))
    assert logits.sharding.is_equivalent_to(logits_s, logits.ndim)
    assert logits.shape == (B, S, cfg.vocab_size) and routes.shape == (B, S, layers, k)

    ref_logits, ref_routes = reference_forward(graphdef, state, tokens)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(routes), np.asarray(ref_routes))
    dense = np.array([not cfg.is_moe_layer(i) for i in range(layers)])
    assert (np.asarray(routes)[:, :, dense] == -1).all()
    assert (np.asarray(routes)[:, :, ~dense] >= 0).all()


_REFERENCE = {}


def reference_forward(graphdef, state, tokens):
    """The forward on one device, no mesh (compiled once for all meshes' parameters)."""
    if "fn" not in _REFERENCE:
        _REFERENCE["fn"] = jax.jit(forward_fn(graphdef), compiler_options=FAST_COMPILE)
    return _REFERENCE["fn"](on_one_device(state), tokens)


@pytest.mark.slow
def test_sharded_init_does_not_depend_on_the_mesh():
    """create_sharded draws the same parameters whatever the mesh (partitionable RNG)."""
    _, _, first = sharded_model(MESHES[0])
    for shape in MESHES[1:]:
        _, _, other = sharded_model(shape)
        for (path, a), (_, b) in zip(nnx.to_flat_state(first), nnx.to_flat_state(other),
                                     strict=True):
            np.testing.assert_allclose(np.asarray(a.get_value()), np.asarray(b.get_value()),
                                       atol=1e-7, rtol=0, err_msg=f"{shape} {path}")


# -- experts live on the expert axis ---------------------------------------------------------------

@pytest.mark.parametrize("shape", [s for s in MESHES if s[2] > 1],
                         ids=lambda s: "x".join(map(str, s)))
def test_expert_weights_split_over_expert_axis(shape):
    cfg = CFG
    mesh, _, state = sharded_model(shape)
    n_expert, e = mesh.shape["expert"], cfg.num_experts
    experts = expert_params(state)
    assert len(experts) == 3 * cfg.num_moe_layers
    for path, var in experts:
        value = var.get_value()
        assert value.shape[0] == e
        assert value.sharding.spec[0] == "expert", (path, value.sharding.spec)
        assert not value.sharding.is_fully_replicated
        held = {}
        for shard in value.addressable_shards:
            assert shard.data.shape[0] == e // n_expert, (path, shard.data.shape)
            expert_coord = int(np.argwhere(mesh.devices == shard.device)[0][2])
            held.setdefault(expert_coord, set()).add(shard.index[0].start or 0)
        # each expert coordinate holds one block of experts, the blocks tile all E experts
        assert all(len(starts) == 1 for starts in held.values()), held
        starts = sorted(next(iter(s)) for s in held.values())
        assert starts == list(range(0, e, e // n_expert)), starts


# -- fsdp: nothing big is replicated ---------------------------------------------------------------

@pytest.mark.slow
def test_fsdp_leaves_no_large_param_replicated(shape=(2, 2, 2, 1)):
    # embedding / lm_head 4096x128 f32 = 2 MiB; experts 8x128x512 f32 = 2 MiB; dense MLP 2 MiB
    cfg = tiny_config(vocab_size=4096, hidden_size=128, intermediate_size=4096,
                      moe_intermediate_size=512, num_hidden_layers=2, tie_word_embeddings=False)
    mesh = sharding.make_mesh(*shape)
    state = nnx.state(sharding.create_sharded(lambda: CausalLM(cfg, nnx.Rngs(0)), mesh))
    large = 0
    for path, var in nnx.to_flat_state(state):
        value = var.get_value()
        if value.nbytes <= MIB:
            continue
        large += 1
        assert not value.sharding.is_fully_replicated, (path, value.sharding.spec)
        assert "fsdp" in jax.tree.leaves(tuple(value.sharding.spec)), (path, value.sharding.spec)
        per_device = max(s.data.nbytes for s in value.addressable_shards)
        assert per_device <= value.nbytes // mesh.shape["fsdp"], (path, per_device)
    # embed, lm_head, dense gate/up/down, and gate/up/down of the MoE layer
    assert large == 2 + 3 + 3


# -- gradients -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sharded_grad_matches_unsharded():
    check_sharded_grads(CFG, (2, 2, 2, 1), seed=2)  # reuses the forward test's model


def check_sharded_grads(cfg, shape, seed):
    """One value_and_grad of loss_fn on the `shape` mesh against one device; returns the
    sharded gradients."""
    mesh, graphdef, state = sharded_model(shape, cfg)
    state_shardings = sharding.shardings(sharding.param_specs(state, mesh), mesh)
    tok_s = named(mesh, ("batch", "length"), (B, S))
    tokens = tokens_for(cfg, seed=seed)
    value_and_grad = jax.value_and_grad(loss_fn(graphdef))
    step = jax.jit(value_and_grad, in_shardings=(state_shardings, tok_s),
                   out_shardings=(NamedSharding(mesh, P()), state_shardings),
                   compiler_options=FAST_COMPILE)
    with jax.set_mesh(mesh):
        loss, grads = step(state, jax.device_put(tokens, tok_s))
    ref_loss, ref_grads = jax.jit(value_and_grad, compiler_options=FAST_COMPILE)(
        on_one_device(state), tokens)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    assert_grads_match(grads, ref_grads, state)
    return grads


def assert_grads_match(grads, ref_grads, state):
    """Sharded gradients equal the single-device ones (to 1e-5 of each gradient's largest
    entry, plus 1e-9), laid out like their parameters, and not all zero."""
    flat, ref_flat = nnx.to_flat_state(grads), nnx.to_flat_state(ref_grads)
    params = nnx.to_flat_state(state)
    for (path, g), (ref_path, r), (_, p) in zip(flat, ref_flat, params, strict=True):
        assert path == ref_path
        g, r, p = g.get_value(), r.get_value(), p.get_value()
        assert g.sharding.is_equivalent_to(p.sharding, g.ndim), (path, g.sharding, p.sharding)
        scale = float(np.max(np.abs(np.asarray(r)))) or 1.0
        # + 1e-9: deep layers' Gated DeltaNet gradients are ~1e-7-1e-6 here, sums over every
        # token of cancelling terms; float32 partial sums split across devices moved one A_log
        # gradient of 1.48e-6 by 3.6e-10 in one run (2.4e-4 relative), 5e-11 in others
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5 * scale + 1e-9,
                                   rtol=1e-4,
                                   err_msg=str(path))
    assert any(float(np.max(np.abs(np.asarray(v.get_value())))) > 0 for _, v in flat)


# -- the hybrid Qwen3.5 model ----------------------------------------------------------------------

def hybrid_config():
    spec = importlib.util.spec_from_file_location("tiny_qwen35",
                                                  ROOT / "configs" / "model" / "tiny_qwen35.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return model_config_from(module.get_config().model).replace(
        vocab_size=256, hidden_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=False)


@pytest.mark.slow
def test_hybrid_sharded_forward_and_grad_match_single_device(shape=(2, 1, 2, 2)):
    """Qwen3.5 (linear heads and attention heads on `tensor`, experts on `expert`): the sharded
    forward and gradients equal one device's."""
    cfg = hybrid_config()
    mesh, _, state = sharded_model(shape, cfg)
    specs = dict(nnx.to_flat_state(sharding.param_specs(state, mesh)))
    assert "tensor" in specs[("model", "layers", 0, "attn", "v")]  # linear heads are split
    grads = check_sharded_grads(cfg, shape, seed=3)
    a_log = dict(nnx.to_flat_state(grads))[("model", "layers", 0, "attn", "A_log")]
    assert float(np.max(np.abs(np.asarray(a_log.get_value())))) > 0  # the decay is trained


@pytest.mark.slow
def test_scanned_layers_shard_and_differentiate_like_unrolled_ones():
    """scan_layers: each stacked parameter keeps its layer's layout (the new leading axis
    unsplit), and the sharded gradients equal one device's: Qwen3 scanned from layer 1, and
    Qwen3.5's block of three linear-attention layers and one full, twice."""
    grads = check_sharded_grads(tiny_config(num_hidden_layers=4, scan_layers=True, remat=True),
                                (2, 2, 2, 1), seed=2)
    gate = dict(nnx.to_flat_state(grads))[("model", "blocks", 0, "mlp", "gate")].get_value()
    assert gate.shape[0] == 3 and gate.sharding.spec[:2] == (None, "expert")  # layers 1-3
    hybrid = hybrid_config()
    check_sharded_grads(hybrid.replace(num_hidden_layers=8, layer_types=hybrid.layer_types * 2,
                                       scan_layers=True, remat=True), (2, 1, 2, 2), seed=3)


@pytest.mark.parametrize("shape", [(2, 2, 2, 1), (1, 1, 4, 2)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.slow
def test_expert_parallel_token_gather_matches_single_device(shape):
    """moe_sharding="gather_tokens": experts stay on their expert-axis device, tokens travel;
    the forward, routes and gradients equal one device's (experts split 2 and 4 ways, the
    second with the expert FFN width split over `tensor` too)."""
    cfg = tiny_config(tie_word_embeddings=False, moe_sharding="gather_tokens")
    mesh, graphdef, state = sharded_model(shape, cfg)
    state_shardings = sharding.shardings(sharding.param_specs(state, mesh), mesh)
    tok_s = named(mesh, ("batch", "length"), (B, S))
    tokens = tokens_for(cfg, seed=4)
    with jax.set_mesh(mesh):
        logits, routes = jax.jit(forward_fn(graphdef), in_shardings=(state_shardings, tok_s),
                                 compiler_options=FAST_COMPILE)(state, jax.device_put(tokens, tok_s))
    ref_logits, ref_routes = jax.jit(forward_fn(graphdef), compiler_options=FAST_COMPILE)(
        on_one_device(state), tokens)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(routes), np.asarray(ref_routes))
    check_sharded_grads(cfg, shape, seed=5)


@pytest.mark.parametrize("mesh_shape,t,chunk,rows", [
    ((1, 2, 4, 1), 6, 1 << 30, P("fsdp", None)),  # fsdp divides 6 rows, fsdp * expert does not
    ((1, 2, 4, 1), 16, 4, P(("fsdp", "expert"), None)),  # exchanged a token per device at a time
    ((1, 1, 4, 2), 36, 8, P("expert", None)),  # 9 tokens per device in chunks of 2, padded;
    # FFN width split over tensor
], ids=["rows-replicated-over-expert", "chunked-exchange", "chunked-exchange-padded"])
@pytest.mark.slow
def test_expert_parallel_ffn_equals_the_plain_one(mesh_shape, t, chunk, rows):
    """gather_tokens straight on the expert FFN: rows that do not divide the expert axis stay
    whole on every device (each runs its own experts on them, partial outputs summed); rows
    split over it are exchanged `chunk` gathered tokens at a time. Values and gradients equal
    the plain expert FFN's."""
    from t1jax.model.dispatch import expert_ffn
    from t1jax.model.expert_sharding import expert_ffn_sharded
    mesh = sharding.make_mesh(*mesh_shape)
    e, d, f, k = 8, 16, 8, 2
    keys = jax.random.split(jax.random.key(7), 5)
    x = jax.random.normal(keys[0], (t, d))
    idx = jax.random.randint(keys[1], (t, k), -1, e, jnp.int32)  # -1: no expert
    w = jax.random.uniform(keys[2], (t, k))
    wg, wu = (jax.random.normal(kk, (e, d, f)) / 4 for kk in keys[3:5])
    wd = jax.random.normal(keys[0], (e, f, d)) / 4
    assert sharding.spec_for(("batch", None), (t, d), dict(mesh.shape)) == rows

    def loss(fn, *args):
        y = fn(*args)
        return jnp.sum(y * jnp.cos(y)), y

    ref = jax.value_and_grad(lambda *a: loss(lambda *b: expert_ffn(*b, strategy="blocked"), *a),
                             argnums=(0, 3, 4, 5), has_aux=True)
    sharded = jax.value_and_grad(lambda *a: loss(lambda *b: expert_ffn_sharded(
        *b, strategy="blocked", mode="gather_tokens", chunk=chunk), *a), argnums=(0, 3, 4, 5),
        has_aux=True)
    (_, y_ref), g_ref = ref(x, idx, w, wg, wu, wd)
    with jax.set_mesh(mesh):
        (_, y), g = jax.jit(sharded)(x, idx, w, wg, wu, wd)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), atol=1e-5, rtol=1e-5)
    for a, b in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_unknown_moe_sharding_is_named():
    with pytest.raises(ValueError, match="moe_sharding"):
        tiny_config(moe_sharding="all_to_all")


# -- spec_for --------------------------------------------------------------------------------------

MESH_222 = {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}


def test_spec_for_composes_batch_over_several_axes():
    assert sharding.spec_for(("batch", "length"), (8, 5), MESH_222) == \
        P(("data", "fsdp", "expert"), None)
    # size-1 mesh axes are dropped; one remaining axis is written bare
    assert sharding.spec_for(("batch",), (8,), {"data": 8, "fsdp": 1, "expert": 1,
                                                "tensor": 1}) == P("data")
    assert sharding.spec_for(("batch",), (8,), {"data": 1, "fsdp": 2, "expert": 4,
                                                "tensor": 1}) == P(("fsdp", "expert"))


def test_spec_for_uses_each_mesh_axis_once():
    # batch takes fsdp first, so embed (-> fsdp) stays replicated in the same array
    assert sharding.spec_for(("batch", "length", "embed"), (8, 4, 64), MESH_222) == \
        P(("data", "fsdp", "expert"), None, None)
    # two logical names mapped to one mesh axis: only the first dim gets it
    rules = (("a", "fsdp"), ("b", "fsdp"))
    assert sharding.spec_for(("a", "b"), (4, 4), MESH_222, rules) == P("fsdp", None)
    # ... and a mesh axis never repeats within one dim's tuple either
    rules = (("a", ("fsdp", "fsdp", "data")),)
    assert sharding.spec_for(("a",), (8,), MESH_222, rules) == P(("fsdp", "data"))
    # experts: expert -> expert, embed -> fsdp, expert_mlp -> tensor (size 1: dropped)
    assert sharding.spec_for(("expert", "embed", "expert_mlp"), (8, 64, 32), MESH_222) == \
        P("expert", "fsdp", None)


@pytest.mark.parametrize("names,shape,mesh,want", [
    (("vocab",), (255,), {"tensor": 2}, P(None)),  # odd vocab: replicated, not an error
    (("embed", "vocab"), (6, 9), {"fsdp": 4, "tensor": 2}, P(None, None)),
    # 6 rows: data (2) divides, data*fsdp (4) does not, so fsdp is skipped; expert is tried next
    (("batch",), (6,), MESH_222, P("data")),
    (("batch",), (12,), {"data": 2, "fsdp": 4, "expert": 3, "tensor": 1}, P(("data", "expert"))),
    (("batch",), (1,), MESH_222, P(None)),
])
def test_spec_for_leaves_non_dividing_axes_out(names, shape, mesh, want):
    assert sharding.spec_for(names, shape, mesh) == want


def test_spec_for_unknown_and_none_names_and_missing_axes():
    assert sharding.spec_for((None, "no_such_name", "norm"), (8, 8, 8), MESH_222) == \
        P(None, None, None)
    # an axis the rules name but the mesh lacks is ignored
    assert sharding.spec_for(("batch",), (8,), {"fsdp": 2}) == P("fsdp")
    assert sharding.spec_for((), (), MESH_222) == P()


def test_spec_for_rejects_more_names_than_dims():
    with pytest.raises(ValueError, match="names"):
        sharding.spec_for(("batch", "length"), (8,), MESH_222)


def test_use_rules_overrides_and_restores():
    names, shape = ("embed",), (64,)
    assert sharding.spec_for(names, shape, MESH_222) == P("fsdp")
    with sharding.use_rules((("embed", "data"),)):
        assert sharding.spec_for(names, shape, MESH_222) == P("data")
        # an explicit `rules` argument beats the active table
        assert sharding.spec_for(names, shape, MESH_222, sharding.RULES) == P("fsdp")
    assert sharding.spec_for(names, shape, MESH_222) == P("fsdp")


def test_every_rule_targets_known_mesh_axes():
    for name, target in sharding.RULES:
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        assert set(axes) <= set(sharding.MESH_AXES), name


# -- mesh helpers and constrain --------------------------------------------------------------------

def test_make_mesh_and_mesh_from_config():
    mesh = sharding.make_mesh(2, 1, 2, 2)
    assert mesh.axis_names == sharding.MESH_AXES
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "expert": 2, "tensor": 2}
    with pytest.raises(ValueError, match="needs 4 devices"):
        sharding.make_mesh(2, 2)
    one = sharding.make_mesh(devices=jax.devices()[:1])
    assert one.size == 1
    mc = ml_collections.ConfigDict(dict(data=1, fsdp=2, expert=4, tensor=1, devices="cpu"))
    assert dict(sharding.mesh_from_config(mc).shape) == {"data": 1, "fsdp": 2, "expert": 4,
                                                        "tensor": 1}


def test_constrain_is_a_no_op_without_a_mesh_and_pins_with_one():
    x = jnp.ones((8, 4, 64))
    assert sharding.constrain(x, ("batch", "length", "embed")) is x
    mesh = sharding.make_mesh(1, 2, 1, 4)
    names = ("batch", "length", "vocab")

    @jax.jit
    def f(a):
        return sharding.constrain(a * 2, names)

    with jax.set_mesh(mesh):
        y = f(x)
    assert y.sharding.is_equivalent_to(named(mesh, names, x.shape), 3)
    assert y.sharding.spec == P("fsdp", None, "tensor")
