"""HF safetensors in and out: single-file and sharded checkpoints, export that transformers loads
(float32 and bfloat16), bit-exact round trips, loud errors for a wrong config or a missing
tensor, the ValueModel backbone from a policy checkpoint, and loading into a sharded model.

Checkpoints are random HF Qwen3-MoE models with large weights (routing far from uniform); layer 1
is dense (mlp_only_layers) and attention has biases, so every conversion in `param_map` is used.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t1jax import sharding
from t1jax.model.config import ModelConfig
from t1jax.model.hf_io import export_hf, load_hf, param_map
from t1jax.model.transformer import CausalLM, ValueModel
from conftest import random_hf_qwen3_moe

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

B, S = 2, 9
ATOL = 1e-4


def random_hf(seed=0, **overrides):
    """The shared random HF Qwen3-MoE with attention biases (their import is checked here)."""
    return random_hf_qwen3_moe(seed, **{"attention_bias": True, **overrides})


def abstract(cfg, cls=CausalLM):
    return nnx.eval_shape(lambda: cls(cfg, nnx.Rngs(0)))


def rbg_rngs(seed):
    """A randomly initialised model needs one RNG kernel per parameter shape; the "rbg" PRNG
    compiles far faster on CPU than the default threefry (seconds saved per model)."""
    return nnx.Rngs(jax.random.key(seed, impl="rbg"))


def flat_params(model) -> dict:
    return {k: np.asarray(jax.device_get(v.get_value()))
            for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assert_params_equal(a, b):
    fa, fb = flat_params(a), flat_params(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        assert fa[key].dtype == fb[key].dtype, key
        np.testing.assert_array_equal(fa[key], fb[key], err_msg="/".join(map(str, key)))


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor(tokens)).logits.float().numpy()


forward = nnx.jit(lambda model, tokens: model(tokens))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The HF model saved as one file and as shards; its config; our model loaded from it."""
    hf = random_hf()
    single, shards = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("shards")
    hf.save_pretrained(single)
    hf.save_pretrained(shards, max_shard_size="20KB")
    cfg = ModelConfig.from_pretrained(single)
    tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (B, S)).astype(np.int32)
    model = load_hf(abstract(cfg), single)
    out = forward(model, jnp.asarray(tokens))
    return dict(hf=hf, single=single, shards=shards, cfg=cfg, tokens=tokens, model=model,
                out=out, ref=hf_logits(hf, tokens))


def test_load_single_file(ckpt):
    assert (ckpt["single"] / "model.safetensors").exists()
    assert not (ckpt["single"] / "model.safetensors.index.json").exists()
    np.testing.assert_allclose(np.asarray(ckpt["out"].logits), ckpt["ref"], rtol=0, atol=ATOL)
    # every parameter equals HF's tensor (spot-check the layouts that need a transpose/reshape)
    sd = {k: v.numpy() for k, v in ckpt["hf"].state_dict().items()}
    p = flat_params(ckpt["model"])
    cfg = ckpt["cfg"]
    np.testing.assert_array_equal(p[("model", "embed")], sd["model.embed_tokens.weight"])
    np.testing.assert_array_equal(p[("lm_head",)], sd["lm_head.weight"].T)
    np.testing.assert_array_equal(
        p[("model", "layers", 0, "attn", "q")],
        sd["model.layers.0.self_attn.q_proj.weight"].T.reshape(32, 4, cfg.head_dim))
    np.testing.assert_array_equal(p[("model", "layers", 0, "mlp", "router")],
                                  sd["model.layers.0.mlp.gate.weight"].T)
    # HF 5 keeps experts fused in memory: gate_up_proj [E, 2F, D] = concat(gate, up) per expert
    gate_up = sd["model.layers.2.mlp.experts.gate_up_proj"]
    f = cfg.moe_intermediate_size
    np.testing.assert_array_equal(p[("model", "layers", 2, "mlp", "gate")],
                                  gate_up[:, :f].transpose(0, 2, 1))
    np.testing.assert_array_equal(p[("model", "layers", 2, "mlp", "up")],
                                  gate_up[:, f:].transpose(0, 2, 1))
    np.testing.assert_array_equal(p[("model", "layers", 2, "mlp", "down")],
                                  sd["model.layers.2.mlp.experts.down_proj"].transpose(0, 2, 1))
    np.testing.assert_array_equal(p[("model", "layers", 1, "mlp", "gate")],
                                  sd["model.layers.1.mlp.gate_proj.weight"].T)
    np.testing.assert_array_equal(p[("model", "layers", 0, "attn", "k_bias")],
                                  sd["model.layers.0.self_attn.k_proj.bias"].reshape(2, -1))


def test_load_sharded_checkpoint(ckpt):
    index = json.loads((ckpt["shards"] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "expected several shard files"
    model = load_hf(abstract(ckpt["cfg"]), ckpt["shards"])
    assert_params_equal(model, ckpt["model"])
    out = forward(model, jnp.asarray(ckpt["tokens"]))
    np.testing.assert_array_equal(np.asarray(out.logits), np.asarray(ckpt["out"].logits))


@pytest.mark.parametrize("shard_bytes", [4 * 2**30, 20_000], ids=["one_file", "sharded"])
def test_export_loads_in_transformers(ckpt, tmp_path, shard_bytes):
    path = export_hf(ckpt["model"], tmp_path / "export", max_shard_bytes=shard_bytes)
    sharded = (path / "model.safetensors.index.json").exists()
    assert sharded == (shard_bytes < 2**20)
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert type(hf2).__name__ == "Qwen3MoeForCausalLM"
    # bit-exact: the exported tensors are the original checkpoint's
    sd, sd2 = ckpt["hf"].state_dict(), hf2.state_dict()
    assert sd.keys() == sd2.keys()
    for k in sd:
        assert sd2[k].dtype == torch.float32, k
        assert torch.equal(sd[k], sd2[k]), k
    logits = hf_logits(hf2, ckpt["tokens"])
    np.testing.assert_array_equal(logits, ckpt["ref"])
    np.testing.assert_allclose(np.asarray(ckpt["out"].logits), logits, rtol=0, atol=ATOL)
    # the exported config.json reads back to the same ModelConfig
    assert ModelConfig.from_pretrained(path) == ckpt["cfg"]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_export_load_round_trip_is_bit_exact(tmp_path, tied):
    hf = random_hf(seed=3, tie_word_embeddings=tied, attention_bias=not tied)
    hf.save_pretrained(tmp_path / "src")
    cfg = ModelConfig.from_pretrained(tmp_path / "src")
    model = load_hf(abstract(cfg), tmp_path / "src")
    for shard_bytes in (4 * 2**30, 20_000):
        path = export_hf(model, tmp_path / f"out{shard_bytes}", max_shard_bytes=shard_bytes)
        again = load_hf(abstract(cfg), path)
        assert_params_equal(again, model)
        names = set()
        for f in path.glob("*.safetensors"):
            names |= set(safetensors_numpy.load_file(str(f)))
        assert names == {k for keys, _ in param_map(cfg).values() for k in keys}
        assert ("lm_head.weight" in names) == (not tied)
    # and transformers reads the export back to the original tensors (tied head included)
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert hf2.config.tie_word_embeddings == tied
    sd = hf.state_dict()
    for k, v in hf2.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_export_bfloat16_loads_in_transformers(ckpt, tmp_path):
    path = export_hf(ckpt["model"], tmp_path / "bf16", dtype="bfloat16")
    from safetensors import safe_open
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    sd = ckpt["hf"].state_dict()
    for k, v in hf2.state_dict().items():
        assert torch.equal(v, sd[k].to(torch.bfloat16).float()), k  # bf16 rounding, nothing else
    logits = hf_logits(hf2, ckpt["tokens"])
    assert np.isfinite(logits).all()
    scale = np.abs(ckpt["ref"]).max()
    assert np.abs(logits - ckpt["ref"]).max() < 0.1 * scale
    # our loader reads the bf16 checkpoint too
    again = load_hf(abstract(ckpt["cfg"]), path)
    np.testing.assert_array_equal(flat_params(again)[("model", "embed")],
                                  hf2.state_dict()["model.embed_tokens.weight"].numpy())


def test_export_bfloat16_config_says_bfloat16(ckpt, tmp_path):
    """transformers 5 reads `dtype` (it wins over the legacy `torch_dtype`); with dtype="auto"
    (its default) a bf16 export must come back as bf16, not be upcast to float32."""
    path = export_hf(ckpt["model"], tmp_path / "bf16", dtype="bfloat16")
    config = json.loads((path / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16", config.get("dtype")
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert hf2.dtype == torch.bfloat16


def test_config_mismatch_raises_clear_error(ckpt):
    wrong = ckpt["cfg"].replace(hidden_size=48)
    with pytest.raises(ValueError) as err:
        load_hf(abstract(wrong), ckpt["single"])
    msg = str(err.value)
    assert str(ckpt["single"]) in msg and "model.embed_tokens.weight" in msg, msg
    assert "(64, 32)" in msg and "(64, 48)" in msg, msg

    fewer = ckpt["cfg"].replace(moe_intermediate_size=8)  # only the experts differ
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.0\.gate_proj\.weight"):
        load_hf(abstract(fewer), ckpt["single"])


@pytest.mark.parametrize("layout", ["single", "shards"])
def test_missing_tensor_raises_key_error(ckpt, tmp_path, layout):
    missing = "model.layers.2.mlp.experts.5.up_proj.weight"
    src = ckpt[layout]
    dst = tmp_path / layout
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    if layout == "single":
        tensors = safetensors_numpy.load_file(str(src / "model.safetensors"))
        del tensors[missing]
        safetensors_numpy.save_file(tensors, str(dst / "model.safetensors"))
    else:
        index = json.loads((src / "model.safetensors.index.json").read_text())
        for f in set(index["weight_map"].values()):
            (dst / f).write_bytes((src / f).read_bytes())
        del index["weight_map"][missing]
        (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(KeyError, match=missing.replace(".", r"\.")):
        load_hf(abstract(ckpt["cfg"]), dst)


def test_missing_checkpoint_files(tmp_path, ckpt):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_hf(abstract(ckpt["cfg"]), tmp_path)


@pytest.mark.slow
def test_value_model_backbone_from_policy_checkpoint(ckpt):
    cfg = ckpt["cfg"]
    model = ValueModel(cfg, rbg_rngs(0))
    head_before = np.asarray(model.value_head.get_value())
    model = load_hf(model, ckpt["single"], head="value")
    # the backbone is the policy's, the value head keeps its init
    policy = flat_params(ckpt["model"])
    for key, value in flat_params(model).items():
        if key[0] == "model":
            np.testing.assert_array_equal(value, policy[key], err_msg="/".join(map(str, key)))
    np.testing.assert_array_equal(np.asarray(model.value_head.get_value()), head_before)
    out = forward(model, jnp.asarray(ckpt["tokens"]))
    assert out.logits is None
    assert out.values.shape == (B, S) and out.values.dtype == jnp.float32
    assert np.isfinite(np.asarray(out.values)).all()
    # same backbone, same experts
    np.testing.assert_array_equal(np.asarray(out.routes), np.asarray(ckpt["out"].routes))
    # a policy load ("lm") of the value model would want lm_head, which it does not have
    with pytest.raises(KeyError, match="lm_head"):
        load_hf(model, ckpt["single"])


@pytest.mark.slow
def test_load_into_sharded_model(ckpt):
    """Into a real, randomly initialised model created sharded on a mesh: each parameter keeps
    its sharding, nothing of the init is left, and the logits are the single-device ones."""
    cfg = ckpt["cfg"]
    mesh = sharding.make_mesh(fsdp=2, expert=4)
    model = sharding.create_sharded(lambda: CausalLM(cfg, rbg_rngs(0)), mesh)
    before = {k: v.get_value().sharding
              for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    experts = before[("model", "layers", 0, "mlp", "gate")]
    assert experts.spec[0] == "expert" and len(experts.device_set) == 8
    assert before[("model", "embed")].spec == jax.sharding.PartitionSpec(None, "fsdp")

    assert load_hf(model, ckpt["single"]) is model  # updated in place
    after = {k: v.get_value() for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert after.keys() == before.keys()
    for key, value in after.items():
        assert value.sharding == before[key], key
    assert_params_equal(model, ckpt["model"])
    # each device holds only its slice
    gate = after[("model", "layers", 0, "mlp", "gate")]
    assert gate.addressable_shards[0].data.shape == (cfg.num_experts // 4, cfg.hidden_size // 2,
                                                     cfg.moe_intermediate_size)

    with jax.set_mesh(mesh):
        out = forward(model, jnp.asarray(ckpt["tokens"]))
    np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ckpt["out"].logits),
                               rtol=0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.routes), np.asarray(ckpt["out"].routes))


@pytest.mark.slow
def test_scanned_model_loads_and_exports_like_the_unrolled_one(tmp_path):
    """scan_layers stores layers 1-3 (one kind, repeated) stacked: loading fills each block
    from its layers' HF tensors, sharded on a mesh with each device holding only its slice, and
    gives the unrolled model's logits; exporting writes the unrolled model's tensors, bit for
    bit."""
    hf = random_hf(seed=3, num_hidden_layers=4, mlp_only_layers=[0])
    hf.save_pretrained(tmp_path / "hf")
    cfg = ModelConfig.from_pretrained(tmp_path / "hf")
    unrolled = load_hf(abstract(cfg), tmp_path / "hf")
    mesh = sharding.make_mesh(fsdp=2, expert=4)
    scanned_cfg = cfg.replace(scan_layers=True)
    scanned = load_hf(sharding.create_sharded(lambda: CausalLM(scanned_cfg, rbg_rngs(0)), mesh),
                      tmp_path / "hf")
    assert len(scanned.model.layers) == 1 and len(scanned.model.blocks) == 1
    gate = scanned.model.blocks[0].mlp.gate.get_value()
    assert gate.shape == (3, cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
    assert gate.sharding.spec[:2] == (None, "expert")
    assert gate.addressable_shards[0].data.shape == (3, cfg.num_experts // 4,
                                                     cfg.hidden_size // 2,
                                                     cfg.moe_intermediate_size)
    for i in (1, 3):
        np.testing.assert_array_equal(
            np.asarray(gate[i - 1]),
            np.asarray(unrolled.model.layers[i].mlp.gate.get_value()))
    tokens = jnp.asarray(np.random.RandomState(1).randint(0, cfg.vocab_size, (B, S)), jnp.int32)
    with jax.set_mesh(mesh):
        out = forward(scanned, tokens)
    np.testing.assert_allclose(np.asarray(out.logits), hf_logits(hf, np.asarray(tokens)),
                               rtol=0, atol=ATOL)
    export_hf(unrolled, tmp_path / "from_unrolled")
    export_hf(scanned, tmp_path / "from_scanned")
    a = safetensors_numpy.load_file(tmp_path / "from_unrolled" / "model.safetensors")
    b = safetensors_numpy.load_file(tmp_path / "from_scanned" / "model.safetensors")
    assert a.keys() == b.keys() and "model.layers.3.mlp.experts.7.down_proj.weight" in a
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_bfloat16_policy_is_exported_as_bfloat16(ckpt, tmp_path):
    """With no dtype the export keeps the parameters' own (a bf16 policy published to a fleet
    is half the bytes of a float32 copy), and equals the explicit bf16 export."""
    model = load_hf(abstract(ckpt["cfg"]), ckpt["single"])
    _, params = nnx.split(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))
    native = export_hf(model, tmp_path / "native")
    explicit = export_hf(ckpt["model"], tmp_path / "explicit", dtype="bfloat16")
    a, b = (safetensors_numpy.load_file(str(p / "model.safetensors")) for p in (native, explicit))
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == jnp.bfloat16, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    config = json.loads((native / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
