"""CausalLM against transformers' Qwen3MoeForCausalLM on several random tiny configs: float32
logits and the experts every MoE layer picks for every token, with and without padding.

Each config is a randomly initialised HF model whose weights are re-drawn with a large std
(matrices N(0, 0.2), norm vectors N(1, 0.1)) so routing is far from uniform and a wrong expert
choice shows in the logits; it is saved with `save_pretrained` and read back with `load_hf`.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from t1jax.model.config import ModelConfig  # noqa: E402
from t1jax.model.hf_io import load_hf  # noqa: E402
from t1jax.model.transformer import CausalLM  # noqa: E402
from conftest import packed_pair  # noqa: E402

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
            tie_word_embeddings=False, attention_bias=False, rope_theta=10_000.0)

CONFIGS = {
    # plain: every layer MoE, raw softmax gate weights, untied head
    "plain": {},
    # renormalised top-k gates, tied embeddings, head_dim 16 (!= hidden / heads)
    "norm_tied_hd16": dict(norm_topk_prob=True, tie_word_embeddings=True, head_dim=16),
    # a dense layer in the middle (mlp_only_layers), top-3 of 6 experts
    "mlp_only": dict(num_hidden_layers=3, mlp_only_layers=[1], norm_topk_prob=True,
                     num_experts=6, num_experts_per_tok=3),
    # MoE on every second layer only (layers 1, 3), attention biases, MHA (kv heads = heads)
    "sparse_step2_bias": dict(num_hidden_layers=4, decoder_sparse_step=2, attention_bias=True,
                              num_key_value_heads=4, head_dim=16, rope_theta=1_000_000.0),
}

ATOL = 1e-4


def make_hf(tmp_path, seed: int = 0, *, hf_config=None, hf_model=None, base=BASE,
            matrix_std: float = 0.2, **overrides):
    """A random HF model (default Qwen3MoeForCausalLM) with large weights (matrices
    N(0, matrix_std), vectors N(1, 0.1)), saved to tmp_path; (hf model, cfg, ours)."""
    torch.manual_seed(seed)
    hf_cfg = (hf_config or transformers.Qwen3MoeConfig)(**{**base, **overrides})
    hf = (hf_model or transformers.Qwen3MoeForCausalLM)(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, matrix_std)
    hf.save_pretrained(tmp_path)
    cfg = ModelConfig.from_pretrained(tmp_path)
    # eval_shape: no random init to compile; load_hf fills every parameter from the checkpoint
    model = load_hf(nnx.eval_shape(lambda: CausalLM(cfg, nnx.Rngs(0))), tmp_path)
    return hf, cfg, model


def hf_forward(hf, tokens: np.ndarray, attention_mask: np.ndarray | None = None,
               router_cls=None):
    """HF float32 logits [B, S, V] and the experts its routers picked: one [B, S, k] array per
    MoE layer, in layer order (captured by forward hooks on every `router_cls`, default
    Qwen3MoeTopKRouter)."""
    router_cls = router_cls or transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter
    picked = []
    routers = [m for m in hf.modules() if isinstance(m, router_cls)]
    hooks = [r.register_forward_hook(lambda mod, args, out: picked.append(out[2].clone()))
             for r in routers]
    try:
        with torch.no_grad():
            kw = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
            logits = hf(torch.tensor(tokens), **kw).logits.float().numpy()
    finally:
        for h in hooks:
            h.remove()
    b, s = tokens.shape
    return logits, [p.numpy().reshape(b, s, -1) for p in picked]


forward = nnx.jit(lambda model, tokens, positions, segment_ids: model(tokens, positions,
                                                                      segment_ids))


def run(model, tokens, segment_ids=None, positions=None):
    # always explicit positions and segment_ids arrays: one trace per shape, shared by the tests
    segment_ids = np.ones_like(tokens) if segment_ids is None else segment_ids
    if positions is None:
        positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    return forward(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))


def tokens_for(cfg, batch=2, seq=12, seed=1):
    return np.random.RandomState(seed).randint(0, cfg.vocab_size, (batch, seq)).astype(np.int32)


@pytest.fixture(scope="module", params=sorted(CONFIGS), ids=sorted(CONFIGS))
def setup(request, tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp(request.param), **CONFIGS[request.param])


def test_config_layout_matches_hf(setup):
    hf, cfg, _ = setup
    hf_moe = [i for i, layer in enumerate(hf.model.layers)
              if type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock"]
    assert list(cfg.moe_layers) == hf_moe
    assert 0 < len(hf_moe) <= cfg.num_hidden_layers


def test_logits_and_routes_match_hf(setup):
    hf, cfg, model = setup
    tokens = tokens_for(cfg)
    ref_logits, ref_routes = hf_forward(hf, tokens)
    out = run(model, tokens)

    assert out.logits.dtype == jnp.float32
    assert out.logits.shape == ref_logits.shape
    np.testing.assert_allclose(np.asarray(out.logits), ref_logits, rtol=0, atol=ATOL)

    routes = np.asarray(out.routes)
    k = cfg.num_experts_per_tok
    assert routes.shape == (*tokens.shape, cfg.num_hidden_layers, k)
    assert routes.dtype == np.int32
    assert len(ref_routes) == cfg.num_moe_layers
    # Compared as sorted sets per token: both sides take top-k by descending probability, but
    # the order inside the k slots is an implementation detail (torch.topk vs lax.top_k break
    # ties differently) and does not change the layer's output, which sums over the k experts.
    for layer, ref in zip(cfg.moe_layers, ref_routes):
        np.testing.assert_array_equal(np.sort(routes[:, :, layer, :], -1), np.sort(ref, -1),
                                      err_msg=f"experts differ at MoE layer {layer}")
        # k distinct experts per token
        assert (np.diff(np.sort(routes[:, :, layer, :], -1), axis=-1) > 0).all()
    dense = [i for i in range(cfg.num_hidden_layers) if i not in cfg.moe_layers]
    for layer in dense:
        assert (routes[:, :, layer, :] == -1).all(), f"dense layer {layer} must report -1"
    # routing is non-trivial: not every token picks the same experts
    first = routes[:, :, cfg.moe_layers[0], :].reshape(-1, k)
    assert len({tuple(sorted(r)) for r in first}) > 1


def test_padding(setup):
    """Row 1 is right-padded (segment_ids 0): its padded tokens route nowhere (-1) and its real
    tokens' logits and routes equal an unpadded forward of that row alone (and HF's)."""
    hf, cfg, model = setup
    tokens = tokens_for(cfg, seed=2)
    real = 7
    segment_ids = np.ones_like(tokens)
    segment_ids[1, real:] = 0
    out = run(model, tokens, segment_ids)
    routes = np.asarray(out.routes)

    assert (routes[1, real:] == -1).all(), "padded tokens must report -1 on every layer"
    full = run(model, tokens)  # row 0 is unpadded: unchanged by row 1's padding
    np.testing.assert_allclose(np.asarray(out.logits[0]), np.asarray(full.logits[0]),
                               rtol=0, atol=1e-5)  # float rounding of another batch mix
    np.testing.assert_array_equal(routes[0], np.asarray(full.routes[0]))

    alone = run(model, tokens[1:2, :real])
    np.testing.assert_allclose(np.asarray(out.logits[1, :real]), np.asarray(alone.logits[0]),
                               rtol=0, atol=1e-5)
    np.testing.assert_array_equal(routes[1, :real], np.asarray(alone.routes[0]))
    assert np.isfinite(np.asarray(out.logits)).all()

    ref_logits, ref_routes = hf_forward(hf, tokens[1:2, :real])
    np.testing.assert_allclose(np.asarray(out.logits[1, :real]), ref_logits[0], rtol=0, atol=ATOL)
    for layer, ref in zip(cfg.moe_layers, ref_routes):
        np.testing.assert_array_equal(np.sort(routes[1, :real, layer], -1), np.sort(ref[0], -1))

    # HF with an attention mask on the same padded batch agrees on the real tokens
    ref_logits, _ = hf_forward(hf, tokens, attention_mask=segment_ids)
    np.testing.assert_allclose(np.asarray(out.logits[1, :real]), ref_logits[1, :real],
                               rtol=0, atol=ATOL)


def test_packed_segments(setup):
    """Two samples packed in one row (segment ids 1 and 2, positions restarting at 0) give each
    sample's own logits and routes: no attention across the segment boundary."""
    _, cfg, model = setup
    tokens = tokens_for(cfg, seed=3)
    a = 5
    packed, segment_ids, positions, b = packed_pair(tokens, a)
    out = run(model, packed, segment_ids, positions)
    ref = run(model, tokens)  # causal: a row's prefix has the prefix's logits
    np.testing.assert_allclose(np.asarray(out.logits[0, :a]), np.asarray(ref.logits[0, :a]),
                               rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.logits[0, a:]), np.asarray(ref.logits[1, :b]),
                               rtol=0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.routes[0, :a]), np.asarray(ref.routes[0, :a]))
    np.testing.assert_array_equal(np.asarray(out.routes[0, a:]), np.asarray(ref.routes[1, :b]))
