"""R3 (rollout routing replay): recorded routes fix which experts each token uses, while the gate
weights come from the live router, so the router still learns. Also the load-balancing loss
against transformers' `load_balancing_loss_func`.

The model is a random HF Qwen3-MoE (large weights, so routing is far from uniform) loaded with
`load_hf`; layer 1 is dense (mlp_only_layers), layers 0 and 2 are MoE.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t1jax.model.dispatch import expert_ffn_loop_reference
from t1jax.model.hf_io import load_hf
from t1jax.model.moe import MoE, gate_weights, load_balancing_loss
from t1jax.model.transformer import log_probs
from conftest import saved_hf_and_loaded

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")

B, S = 2, 10


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("r3")
    hf, cfg, model = saved_hf_and_loaded(path)
    tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (B, S)).astype(np.int32)
    return hf, cfg, model, tokens


@nnx.jit
def forward(model, tokens, segment_ids, routes):
    return model(tokens, segment_ids=segment_ids, routes=routes)


def run(model, tokens, routes, segment_ids=None):
    """Always the same pytree structure (routes and segment_ids arrays): one trace."""
    segment_ids = np.ones_like(tokens) if segment_ids is None else segment_ids
    return forward(model, jnp.asarray(tokens), jnp.asarray(segment_ids), jnp.asarray(routes))


_free = nnx.jit(lambda model, tokens, segment_ids: model(tokens, segment_ids=segment_ids))


def free(model, tokens, cfg, segment_ids=None):
    """Free routing (routes=None): the model picks its own experts."""
    seg = np.ones_like(tokens) if segment_ids is None else segment_ids
    return _free(model, jnp.asarray(tokens), jnp.asarray(seg))


def rolled(routes, cfg):
    """Every chosen expert id shifted by one (mod E): still k distinct experts per token."""
    routes = np.asarray(routes)
    return np.where(routes >= 0, (routes + 1) % cfg.num_experts, -1).astype(np.int32)


@pytest.mark.slow
def test_replaying_own_routes_is_identity(setup):
    _, cfg, model, tokens = setup
    out = free(model, tokens, cfg)
    again = run(model, tokens, out.routes)
    np.testing.assert_array_equal(np.asarray(again.routes), np.asarray(out.routes))
    np.testing.assert_array_equal(np.asarray(again.logits), np.asarray(out.logits))
    np.testing.assert_array_equal(np.asarray(again.aux_loss), np.asarray(out.aux_loss))


def test_replaying_other_routes_uses_them(setup):
    _, cfg, model, tokens = setup
    own = np.asarray(free(model, tokens, cfg).routes)
    other = rolled(own, cfg)
    assert (other[:, :, list(cfg.moe_layers)] != own[:, :, list(cfg.moe_layers)]).all()
    out = run(model, tokens, other)
    np.testing.assert_array_equal(np.asarray(out.routes), other)
    assert (np.asarray(out.routes)[:, :, 1] == -1).all()  # the dense layer
    base = run(model, tokens, own)
    assert np.abs(np.asarray(out.logits) - np.asarray(base.logits)).max() > 1e-2

    # Replaying only one MoE layer differently changes that layer and keeps the other's
    mixed = own.copy()
    mixed[:, :, 2] = other[:, :, 2]
    out = run(model, tokens, mixed)
    np.testing.assert_array_equal(np.asarray(out.routes), mixed)
    # changing only the last MoE layer's experts changes the logits too
    assert np.abs(np.asarray(out.logits) - np.asarray(base.logits)).max() > 1e-2


def test_replayed_routes_for_padding_are_dropped(setup):
    """A padded token (segment 0) routes nowhere even if the replayed routes name experts."""
    _, cfg, model, tokens = setup
    own = np.asarray(free(model, tokens, cfg).routes)
    seg = np.ones_like(tokens)
    seg[0, 6:] = 0
    out = run(model, tokens, own, seg)
    routes = np.asarray(out.routes)
    assert (routes[0, 6:] == -1).all()
    np.testing.assert_array_equal(routes[0, :6], own[0, :6])
    np.testing.assert_array_equal(routes[1], own[1])


def _value_and_grad(graphdef, rest, tokens):
    """jit(value_and_grad) of the mean next-token NLL w.r.t. the Params; the routes are an
    argument so every replay shares one compile."""
    def loss(params, routes):
        out = nnx.merge(graphdef, params, rest)(tokens, routes=routes)
        return -log_probs(out.logits[:, :-1], tokens[:, 1:]).mean()
    return jax.jit(jax.value_and_grad(loss))


@pytest.mark.slow
def test_router_gets_gradient_under_replay(setup):
    _, cfg, model, tokens = setup
    tokens = jnp.asarray(tokens)
    own = free(model, tokens, cfg).routes
    replay = jnp.asarray(rolled(own, cfg))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    value_and_grad = _value_and_grad(graphdef, rest, tokens)
    value, grads = value_and_grad(params, replay)
    assert np.isfinite(float(value))
    flat = dict(nnx.to_flat_state(grads))
    for layer in cfg.moe_layers:
        g = np.asarray(flat[("model", "layers", layer, "mlp", "router")].get_value())
        assert np.isfinite(g).all() and np.abs(g).max() > 1e-6, f"router {layer}: no gradient"
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))

    # The gradient is the true derivative of the replayed loss: a central finite difference
    # along the router gradient (selection is fixed under replay, so the loss is smooth).
    key = ("model", "layers", 0, "mlp", "router")
    g = flat[key].get_value()
    direction = g / jnp.linalg.norm(g)
    h = 1e-2

    def shifted(sign):
        p = jax.tree.map(lambda x: x, params)  # a copy: new Variables
        pf = dict(nnx.to_flat_state(p))
        pf[key].set_value(pf[key].get_value() + sign * h * direction)
        return float(value_and_grad(p, replay)[0])

    fd = (shifted(+1) - shifted(-1)) / (2 * h)
    np.testing.assert_allclose(fd, float(jnp.sum(g * direction)), rtol=2e-2)
    assert float(value_and_grad(params, replay)[0]) == float(value)  # params untouched


def test_gate_weights_follow_live_router(setup):
    """Under a fixed replay, changing the router changes the output (through the gate weights)
    but not the experts used."""
    _, cfg, model, tokens = setup
    replay = rolled(free(model, tokens, cfg).routes, cfg)
    base = run(model, tokens, replay)
    graphdef, state = nnx.split(model)
    flat = dict(nnx.to_flat_state(state))
    key = ("model", "layers", 2, "mlp", "router")
    original = flat[key].get_value()
    noise = 0.3 * np.random.RandomState(3).randn(*original.shape).astype(np.float32)
    try:
        flat[key].set_value(original + noise)
        nnx.update(model, state)
        out = run(model, tokens, replay)
    finally:
        flat[key].set_value(original)
        nnx.update(model, state)
    np.testing.assert_array_equal(np.asarray(out.routes), replay)
    assert np.abs(np.asarray(out.logits) - np.asarray(base.logits)).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(run(model, tokens, replay).logits),
                                  np.asarray(base.logits))  # restored


def _softmax64(logits):
    z = np.asarray(logits, np.float64)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _moe(normalize, seed=0, dim=16, hidden=8, experts=6, k=2):
    """A standalone MoE layer (abstract init, then numpy weights: no RNG kernels to compile) with
    large router and expert weights, so routing is non-uniform and outputs visible."""
    moe = nnx.eval_shape(lambda: MoE(dim, hidden, experts, k, normalize, jnp.float32,
                                     nnx.Rngs(seed)))
    rng = np.random.RandomState(seed)
    for name in ("router", "gate", "up", "down"):
        p = getattr(moe, name)
        p.set_value(jnp.asarray(rng.randn(*p.get_value().shape).astype(np.float32)))
    x = jnp.asarray(rng.randn(12, dim).astype(np.float32))
    return moe, x


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.slow
def test_replay_weights_are_live_softmax_over_selected(normalize):
    moe, x = _moe(normalize)
    e, k = moe.router.shape[1], moe.top_k
    rng = np.random.RandomState(0)
    indices = np.stack([rng.permutation(e)[:k] for _ in range(x.shape[0])]).astype(np.int32)
    indices[5] = -1  # a padding token: routed nowhere
    valid = np.arange(x.shape[0]) != 5
    y, routing, aux, free = moe(x, jnp.asarray(indices), jnp.asarray(valid))

    np.testing.assert_array_equal(np.asarray(routing.indices), indices)
    probs64 = _softmax64(np.asarray(x) @ np.asarray(moe.router.get_value()))
    picked = np.take_along_axis(probs64, np.maximum(indices, 0), -1) * (indices >= 0)
    if normalize:
        picked = picked / np.maximum(picked.sum(-1, keepdims=True), 1e-20)
    np.testing.assert_allclose(np.asarray(routing.weights), picked, rtol=1e-5, atol=1e-7)
    probs = jax.nn.softmax(x @ moe.router.get_value(), axis=-1)
    np.testing.assert_allclose(np.asarray(routing.weights),
                               np.asarray(gate_weights(probs, jnp.asarray(indices), normalize)),
                               rtol=1e-6, atol=1e-7)
    if normalize:
        np.testing.assert_allclose(np.asarray(routing.weights).sum(-1)[indices[:, 0] >= 0], 1.0,
                                   rtol=1e-6)
    assert (np.asarray(routing.weights)[5] == 0).all()

    # the output uses exactly these experts and weights
    ref = expert_ffn_loop_reference(x, indices, picked, moe.gate.get_value(), moe.up.get_value(),
                                    moe.down.get_value())
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-4, atol=1e-4)
    assert (np.asarray(y)[5] == 0).all()
    # the router's own top-k is reported beside the replayed selection
    own = np.argsort(-probs64, axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(np.sort(np.asarray(free)[valid], -1), np.sort(own[valid], -1))
    assert (np.asarray(free)[5] == -1).all()


def test_replay_row_without_record_routes_freely():
    """A token the rollout never ran the model on (all -1) takes the router's own top-k."""
    moe, x = _moe(True, seed=2)
    k = moe.top_k
    indices = np.stack([np.arange(k)] * x.shape[0]).astype(np.int32)
    indices[3] = -1
    _, routing, _, free = moe(x, jnp.asarray(indices))
    np.testing.assert_array_equal(np.asarray(routing.indices)[3], np.asarray(free)[3])
    np.testing.assert_array_equal(np.asarray(routing.indices)[4], np.arange(k))
    assert (np.asarray(routing.weights)[3] > 0).all()


@pytest.mark.parametrize("normalize", [False, True])
def test_free_routing_matches_hf_router(normalize):
    """Free top-k and its gate weights equal Qwen3MoeTopKRouter's (indices and scores)."""
    moe, x = _moe(normalize, seed=4)
    e, k = moe.router.shape[1], moe.top_k
    hf_cfg = transformers.Qwen3MoeConfig(hidden_size=x.shape[1], num_experts=e,
                                         num_experts_per_tok=k, norm_topk_prob=normalize)
    router = qwen3_moe.Qwen3MoeTopKRouter(hf_cfg)
    with torch.no_grad():
        router.weight.copy_(torch.tensor(np.asarray(moe.router.get_value()).T))
        _, scores, hf_idx = router(torch.tensor(np.asarray(x)))
    routing = moe.route(x)
    _, used, _, _ = moe(x)
    np.testing.assert_array_equal(np.asarray(used.indices), np.asarray(routing.indices))
    # both sort the k experts by descending probability; compare (index, weight) pairs sorted
    # by index so an implementation's tie order cannot matter
    ours_i, ours_w = np.asarray(routing.indices), np.asarray(routing.weights)
    o, h = np.argsort(ours_i, -1), np.argsort(hf_idx.numpy(), -1)
    np.testing.assert_array_equal(np.take_along_axis(ours_i, o, -1),
                                  np.take_along_axis(hf_idx.numpy(), h, -1))
    np.testing.assert_allclose(np.take_along_axis(ours_w, o, -1),
                               np.take_along_axis(scores.numpy(), h, -1), rtol=1e-5, atol=1e-7)
    # and replaying HF's indices reproduces HF's scores
    _, replayed, _, _ = moe(x, jnp.asarray(hf_idx.numpy().astype(np.int32)))
    np.testing.assert_allclose(np.asarray(replayed.weights), scores.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_matches_transformers(masked):
    rng = np.random.RandomState(0)
    b, s, e, k = 3, 7, 8, 2
    logits = (3.0 * rng.randn(b * s, e)).astype(np.float32)
    mask = np.ones((b, s), np.int64)
    if masked:
        mask[0, 4:] = 0
        mask[2, 1:] = 0
    probs = jax.nn.softmax(jnp.asarray(logits), axis=-1)
    _, top = jax.lax.top_k(probs, k)
    ours = load_balancing_loss(probs, top, jnp.asarray(mask.reshape(-1) > 0))
    ref = qwen3_moe.load_balancing_loss_func((torch.tensor(logits),), e, k,
                                             torch.tensor(mask) if masked else None)
    np.testing.assert_allclose(float(ours), float(ref), rtol=1e-5)
    # uniform routing probabilities give the minimum, k (E * sum_e (k/E) * (1/E))
    uniform = jnp.full((b * s, e), 1.0 / e)
    assert float(load_balancing_loss(uniform, top, jnp.ones(b * s, bool))) == pytest.approx(k)


def test_moe_layer_aux_matches_transformers():
    moe, x = _moe(True, seed=7)
    e, k = moe.router.shape[1], moe.top_k
    logits = torch.tensor(np.asarray(x @ moe.router.get_value()))
    valid = np.ones(x.shape[0], bool)
    valid[-3:] = False
    _, _, aux, _ = moe(x, valid_t=jnp.asarray(valid))
    ref = qwen3_moe.load_balancing_loss_func((logits,), e, k,
                                             torch.tensor(valid.astype(np.int64))[None])
    np.testing.assert_allclose(float(aux), float(ref), rtol=1e-5)
    # under replay the loss counts the experts actually used (the replayed ones)
    indices = np.roll(np.asarray(moe.route(x).indices), 1, axis=0)
    _, _, aux, _ = moe(x, jnp.asarray(indices), jnp.asarray(valid))
    probs = jax.nn.softmax(x @ moe.router.get_value(), axis=-1)
    np.testing.assert_allclose(float(aux), float(load_balancing_loss(
        probs, jnp.where(jnp.asarray(valid)[:, None], jnp.asarray(indices), -1),
        jnp.asarray(valid))), rtol=1e-6)


def test_model_aux_loss_is_mean_over_moe_layers(setup):
    """aux_loss = mean over MoE layers of transformers' per-layer loss (on the router logits HF
    records for each MoE layer), with padding excluded via the attention mask."""
    hf, cfg, model, tokens = setup
    seg = np.ones_like(tokens)
    seg[1, 7:] = 0
    out = free(model, tokens, cfg, seg)
    with torch.no_grad():
        ref = hf(torch.tensor(tokens), attention_mask=torch.tensor(seg),
                 output_router_logits=True)
    assert len(ref.router_logits) == cfg.num_moe_layers == 2
    per_layer = [float(qwen3_moe.load_balancing_loss_func(
        (logits,), cfg.num_experts, cfg.num_experts_per_tok, torch.tensor(seg)))
        for logits in ref.router_logits]
    assert out.aux_loss.dtype == jnp.float32 and out.aux_loss.shape == ()
    np.testing.assert_allclose(float(out.aux_loss), np.mean(per_layer), rtol=1e-4)
    assert per_layer[0] != pytest.approx(per_layer[1])  # the mean is not one layer's loss
