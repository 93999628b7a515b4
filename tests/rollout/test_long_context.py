"""What makes 32k-64k-token training rows fit (ahead-of-time compile: the recipe's aot phase),
checked on CPU against the plain paths: the model with flash attention computes the naive
attention's logits and routes (packed rows, and prefill + decode through the KV cache in the
engine), layer remat leaves loss and gradients unchanged, layers under lax.scan (scan_layers)
compute the unrolled model's loss, gradients, routes and aux loss, and the trainer's chunked
vocabulary reduction (rl.logits_chunk) gives the full-logits step's update and metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_causal_lm
from t1jax.model.layer_stack import scan_plan, stored_at
from t1jax.model.transformer import CausalLM, use_flash
from t1jax.rollout.engine import SamplingParams
from t1jax.rollout.jax_engine import JaxEngine


def variant(model, **changes):
    """The same parameters under a config with `changes` (attention, remat, ...); with
    scan_layers the repeating layers' parameters stacked into blocks."""
    cfg = model.model.cfg.replace(**changes)
    target = nnx.eval_shape(lambda: CausalLM(cfg, nnx.Rngs(0)))
    graphdef, abstract = nnx.split(target)
    sources = {}
    for path, var in nnx.to_flat_state(nnx.state(model)):
        stored, r = stored_at(cfg, path)
        sources.setdefault(stored, {})[r] = var.get_value()
    flat = [(path, var.replace(sources[path][None] if None in sources[path] else
                               jnp.stack([sources[path][r] for r in sorted(sources[path])])))
            for path, var in nnx.to_flat_state(abstract)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def per_layer(cfg, grads, path):
    """The gradient of the per-layer parameter `path` in a model of `cfg` (stacked or not)."""
    stored, r = stored_at(cfg, path)
    value = np.asarray(dict(nnx.to_flat_state(grads))[stored].get_value())
    return value if r is None else value[r]


def packed_rows(vocab):
    """Row 0: two chunks (positions restart) and padding; row 1: one chunk over the whole row."""
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, vocab, (2, 80)).astype(np.int32)
    seg = np.zeros((2, 80), np.int32)
    pos = np.zeros((2, 80), np.int32)
    seg[0, :30], pos[0, :30] = 1, np.arange(30)
    seg[0, 30:65], pos[0, 30:65] = 2, np.arange(35)
    seg[1], pos[1] = 1, np.arange(80)
    return tokens, pos, seg


def test_auto_picks_flash_for_long_score_matrices_only():
    assert not use_flash("auto", 1, 65536)  # decode: one query row
    assert not use_flash("auto", 512, 512)
    assert use_flash("auto", 2048, 2048) and use_flash("auto", 4096, 65536)
    assert use_flash("flash", 8, 8) and not use_flash("naive", 65536, 65536)


@pytest.mark.slow
def test_flash_model_equals_naive_on_packed_rows(any_model):
    tokens, pos, seg = packed_rows(any_model.model.cfg.vocab_size)
    outs = {}
    for impl in ("naive", "flash"):
        model = variant(any_model, attention=impl, attention_block=16)
        outs[impl] = jax.jit(lambda m, t, p, s: m(t, p, s))(model, tokens, pos, seg)
    valid = seg > 0
    np.testing.assert_allclose(np.asarray(outs["flash"].logits)[valid],
                               np.asarray(outs["naive"].logits)[valid], atol=2e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(outs["flash"].routes),
                                  np.asarray(outs["naive"].routes))


@pytest.mark.slow
def test_flash_engine_equals_naive_engine(any_model):
    """Prefill (flash over the cache's keys) and decode give the same greedy ids, log-probs and
    routes as the naive attention."""
    prompts = [[5, 17, 300, 42, 7, 9, 11, 13, 2, 4], [9, 1, 2]]
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    results = {}
    for impl in ("naive", "flash"):
        engine = JaxEngine(variant(any_model, attention=impl, attention_block=4), max_batch=2,
                           max_len=32, prefill_buckets=(16,))
        results[impl] = engine.generate(prompts, params)
    for a, b in zip(results["flash"], results["naive"]):
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(a.output_logprobs, b.output_logprobs, atol=1e-4)
        np.testing.assert_array_equal(a.routed_experts, b.routed_experts)


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
@pytest.mark.slow
def test_remat_keeps_loss_and_gradients(family):
    base = tiny_causal_lm(family)
    tokens, pos, seg = packed_rows(base.model.cfg.vocab_size)

    def loss(model):
        out = model(tokens, pos, seg)
        return jnp.mean(jnp.where(seg[..., None] > 0, out.logits, 0.0) ** 2)

    results = [jax.jit(nnx.value_and_grad(loss))(variant(base, remat=r)) for r in (False, True)]
    (l0, g0), (l1, g1) = results
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    for (path, a), (_, b) in zip(nnx.to_flat_state(g0), nnx.to_flat_state(g1), strict=True):
        scale = float(np.max(np.abs(np.asarray(a.get_value())))) or 1.0
        np.testing.assert_allclose(np.asarray(b.get_value()), np.asarray(a.get_value()),
                                   atol=1e-6 * scale, rtol=1e-5, err_msg=str(path))
    def remat_calls(model):  # top-level ones: a layer each (Gated DeltaNet's own chunk-group
        # checkpoints sit inside its scan, so they are not counted here)
        jaxpr = jax.make_jaxpr(lambda m: loss(m))(model).jaxpr
        return sum(e.primitive.name == "remat2" for e in jaxpr.eqns)
    assert remat_calls(variant(base, remat=True)) == base.model.cfg.num_hidden_layers
    assert remat_calls(variant(base, remat=False)) == 0


@pytest.mark.slow
def test_moe_token_chunks_leave_the_model_unchanged(any_model):
    """The expert FFN over 16 tokens at a time (moe_token_chunk; 160 tokens, the last chunk
    padded) gives the one-pass model's logits and routes."""
    tokens, pos, seg = packed_rows(any_model.model.cfg.vocab_size)
    outs = [jax.jit(lambda m, t, p, s: m(t, p, s))(variant(any_model, moe_token_chunk=c),
                                                   tokens, pos, seg) for c in (8192, 16)]
    np.testing.assert_allclose(np.asarray(outs[1].logits), np.asarray(outs[0].logits),
                               atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(outs[1].routes), np.asarray(outs[0].routes))


def deeper(family: str, layers: int):
    """A fresh tiny model of `family` with `layers` layers (Qwen3.5: its 3 + 1 block repeated)."""
    cfg = tiny_causal_lm(family).model.cfg
    changes = dict(num_hidden_layers=layers)
    if cfg.layer_types:
        changes["layer_types"] = cfg.layer_types * (layers // len(cfg.layer_types))
    return CausalLM(cfg.replace(**changes), nnx.Rngs(1))


@pytest.mark.slow
def test_scan_plan_finds_the_repeating_block():
    """Qwen3 with its dense layer 0: a scan of 1-layer blocks from layer 1; Qwen3.5: blocks of
    three linear-attention layers and one full; one block alone does not repeat."""
    plan = lambda family, n: scan_plan(deeper(family, n).model.cfg.replace(scan_layers=True))  # noqa
    assert plan("qwen3_moe", 4) == (1, 1)
    assert plan("qwen3_5_moe", 8) == (0, 4)
    assert plan("qwen3_5_moe", 4) == (4, 0)
    assert scan_plan(deeper("qwen3_moe", 4).model.cfg) == (4, 0)  # scan_layers off


@pytest.mark.slow
def test_scanned_layers_are_stored_stacked():
    """scan_layers stores each block position's parameters once, stacked over the repeats (no
    per-layer copies), each laid out like its layer with the leading axis unsplit; the engine's
    per-layer view of layer i is that layer's slice."""
    base = deeper("qwen3_5_moe", 8)
    scanned = variant(base, scan_layers=True)
    assert len(scanned.model.layers) == 0 and len(scanned.model.blocks) == 4
    gate = scanned.model.blocks[0].mlp.gate
    assert gate.shape == (2,) + base.model.layers[0].mlp.gate.shape
    assert gate.get_metadata()["out_sharding"] == (None, "expert", "embed", "expert_mlp")
    flat = dict(nnx.to_flat_state(nnx.state(scanned)))
    assert not any("layers" in path for path in flat)
    for i in (0, 3, 5):
        np.testing.assert_array_equal(np.asarray(scanned.model.layer(i).mlp.gate[...]),
                                      np.asarray(base.model.layers[i].mlp.gate[...]))
        assert scanned.model.layer(i).mlp.gate.get_metadata()["out_sharding"] == \
            base.model.layers[i].mlp.gate.get_metadata()["out_sharding"]
    # the engine runs the stacked layers one by one through the KV cache: same ids, log-probs
    # and routes as the unrolled model
    prompts, params = [[5, 17, 300, 42, 7, 9], [9, 1, 2]], SamplingParams(temperature=0.0,
                                                                          max_new_tokens=4)
    results = [JaxEngine(m, max_batch=2, max_len=16, prefill_buckets=(8,)).generate(prompts, params)
               for m in (base, scanned)]
    for a, b in zip(*results):
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(a.output_logprobs, b.output_logprobs, atol=1e-5)
        np.testing.assert_array_equal(a.routed_experts, b.routed_experts)


@pytest.mark.parametrize("family,layers,remat", [("qwen3_moe", 4, False), ("qwen3_moe", 4, True),
                                                 ("qwen3_5_moe", 8, True)])  # remat: as configs run
@pytest.mark.slow
def test_scanned_layers_equal_unrolled_layers(family, layers, remat):
    """Loss, every gradient, the routes used and the router's own, and the aux loss are the
    unrolled model's, free and with replayed (R3) routes; the scan really is one loop. Qwen3.5
    runs the replay only: its rows route some tokens freely (-1), and routes=None is the scan's
    one family-independent branch, which Qwen3 covers (a qwen3_5_moe compile costs ~30 s)."""
    base = deeper(family, layers)
    cfg = base.model.cfg
    tokens, pos, seg = packed_rows(cfg.vocab_size)
    rng = np.random.RandomState(2)
    replay = rng.randint(0, cfg.num_experts, (2, 80, layers, cfg.num_experts_per_tok))
    replay[:, ::7] = -1  # some tokens route freely
    replay = jnp.asarray(replay, jnp.int32)

    def loss(model, routes):
        out = model(tokens, pos, seg, routes=routes)
        value = jnp.mean(jnp.where(seg[..., None] > 0, out.logits, 0.0) ** 2) + out.aux_loss
        return value, out

    for routes in ((None, replay) if family == "qwen3_moe" else (replay,)):
        (l0, o0), g0 = jax.jit(nnx.value_and_grad(loss, has_aux=True))(
            variant(base, remat=remat), routes)
        (l1, o1), g1 = jax.jit(nnx.value_and_grad(loss, has_aux=True))(
            variant(base, remat=remat, scan_layers=True), routes)
        np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
        np.testing.assert_allclose(float(o1.aux_loss), float(o0.aux_loss), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(o1.routes), np.asarray(o0.routes))
        np.testing.assert_array_equal(np.asarray(o1.free_routes), np.asarray(o0.free_routes))
        scanned_cfg = cfg.replace(scan_layers=True)
        assert sum(v.get_value().size for _, v in nnx.to_flat_state(g1)) == \
            sum(v.get_value().size for _, v in nnx.to_flat_state(g0))
        for path, a in nnx.to_flat_state(g0):
            a, b = np.asarray(a.get_value()), per_layer(scanned_cfg, g1, path)
            # each gradient to 1e-4 of its own norm plus a 1e-9 floor: float32 sums in another
            # order move Gated DeltaNet's A_log and dt_bias gradients (~1e-7 here) by ~1e-10,
            # while a missing or misrouted gradient misses by its own size
            assert np.linalg.norm(b - a) <= 1e-4 * np.linalg.norm(a) + 1e-9, path

    def top_level_scans(scan):
        model = variant(base, scan_layers=scan)
        jaxpr = jax.make_jaxpr(lambda m: m(tokens, pos, seg).logits)(model).jaxpr
        return [e.params["length"] for e in jaxpr.eqns if e.primitive.name == "scan"]
    # one loop over the repeats holds every scanned layer (Gated DeltaNet's own chunk scans
    # sit inside it, where unrolled they are one per linear-attention layer)
    repeats = {"qwen3_moe": layers - 1, "qwen3_5_moe": layers // 4}[family]
    assert top_level_scans(True) == [repeats]
    assert len(top_level_scans(False)) == {"qwen3_moe": 0, "qwen3_5_moe": layers * 3 // 4}[family]


@pytest.mark.parametrize("family,layers,scan", [("qwen3_moe", 4, True), ("qwen3_5_moe", 8, True),
                                                ("qwen3_moe", 4, False)])
@pytest.mark.slow
def test_offloaded_layer_inputs_change_nothing(family, layers, scan):
    """offload_layer_inputs keeps each layer's saved input in host memory (pinned_host) between
    the passes: loss and gradients are remat's, scanned or unrolled, and the program really
    moves them there (host-placed values in the program; none without it)."""
    base = deeper(family, layers)
    tokens, pos, seg = packed_rows(base.model.cfg.vocab_size)

    def loss(model):
        out = model(tokens, pos, seg)
        return jnp.mean(jnp.where(seg[..., None] > 0, out.logits, 0.0) ** 2) + out.aux_loss

    step = jax.jit(nnx.value_and_grad(loss))
    models = [variant(base, remat=True, scan_layers=scan, offload_layer_inputs=o)
              for o in (False, True)]
    (l0, g0), (l1, g1) = (step(m) for m in models)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    for (path, a), (_, b) in zip(nnx.to_flat_state(g0), nnx.to_flat_state(g1), strict=True):
        a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
        assert np.linalg.norm(b - a) <= 1e-5 * np.linalg.norm(a) + 1e-9, path
    # host-resident values print as f32<host>[...] in the jaxpr (CPU's lowering drops the
    # placement, so the compiled program cannot show it here; on TPU, the aot phase reports it)
    host = [str(jax.make_jaxpr(nnx.value_and_grad(loss))(m)).count("<host>[") for m in models]
    assert host[0] == 0 and host[1] > 0, host


def test_offload_needs_remat():
    cfg = tiny_causal_lm("qwen3_moe").model.cfg
    with pytest.raises(ValueError, match="offload_layer_inputs needs remat"):
        cfg.replace(offload_layer_inputs=True, remat=False)
