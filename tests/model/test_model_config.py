"""ModelConfig against transformers' Qwen3-MoE: config.json round trip, layer layout, parameter
counts, and the loud rejections (other architectures, scaled RoPE, sliding windows)."""

import importlib.util
import json
import random
from pathlib import Path

import pytest

from t1jax.model.config import ModelConfig, model_config_from
from t1jax.model.sizes import param_counts

ROOT = Path(__file__).resolve().parents[2]
REAL = ("qwen3_30b_a3b", "qwen3_235b_a22b")


def load_config(name: str, arg=None):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / "model" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def tiny(**kw) -> ModelConfig:
    return model_config_from(load_config("tiny").model).replace(**kw)


# The Qwen/Qwen3-30B-A3B config.json as published (older transformers: num_experts, rope_theta).
QWEN3_30B_JSON = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_real_config_json_matches_our_config_file():
    ours = model_config_from(load_config("qwen3_30b_a3b").model)
    loaded = ModelConfig.from_hf_dict(QWEN3_30B_JSON, param_dtype="bfloat16",
                                      compute_dtype="bfloat16", remat=True, scan_layers=True)
    assert loaded == ours


def test_from_pretrained_reads_dir_and_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_30B_JSON))
    assert ModelConfig.from_pretrained(tmp_path) == ModelConfig.from_pretrained(
        tmp_path / "config.json")
    assert ModelConfig.from_pretrained(tmp_path).num_experts == 128


def test_num_experts_and_num_local_experts_both_read():
    d = tiny().to_hf_dict()
    n = d.pop("num_experts")
    assert ModelConfig.from_hf_dict({**d, "num_local_experts": n}).num_experts == n
    assert ModelConfig.from_hf_dict({**d, "num_experts": n}).num_experts == n
    with pytest.raises(ValueError, match="num_experts"):
        ModelConfig.from_hf_dict(d)


@pytest.mark.parametrize("field,value", [("model_type", "llama"), ("model_type", "qwen3_next"),
                                         ("architectures", ["LlamaForCausalLM"])])
def test_other_architectures_rejected(field, value):
    d = {**tiny().to_hf_dict(), field: value}
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf_dict(d, source="/ckpt/config.json")
    msg = str(err.value)
    assert "/ckpt/config.json" in msg and field in msg and repr(value) in msg
    assert "qwen3_moe" in msg


@pytest.mark.parametrize("field", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("rope_type", ["yarn", "linear", "dynamic"])
def test_scaled_rope_rejected(field, rope_type):
    d = {**tiny().to_hf_dict(), field: {"rope_type": rope_type, "factor": 4.0,
                                        "original_max_position_embeddings": 32768}}
    with pytest.raises(ValueError, match=f"{field}.rope_type='{rope_type}'"):
        ModelConfig.from_hf_dict(d)


def test_rope_theta_sources():
    d = tiny().to_hf_dict()
    del d["rope_parameters"]
    assert ModelConfig.from_hf_dict({**d, "rope_theta": 5e5}).rope_theta == 5e5
    assert ModelConfig.from_hf_dict(
        {**d, "rope_parameters": {"rope_type": "default", "rope_theta": 7.0}}).rope_theta == 7.0
    assert ModelConfig.from_hf_dict({**d, "rope_scaling": {"type": "default"}}).rope_theta == \
        d["rope_theta"]
    del d["rope_theta"]
    assert ModelConfig.from_hf_dict(d).rope_theta == 10_000.0  # HF's default


def test_other_rejections_and_validation():
    d = tiny().to_hf_dict()
    with pytest.raises(ValueError, match="use_sliding_window"):
        ModelConfig.from_hf_dict({**d, "use_sliding_window": True, "sliding_window": 4096})
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        ModelConfig.from_hf_dict({**d, "hidden_act": "gelu"})
    missing = {k: v for k, v in d.items() if k != "moe_intermediate_size"}
    with pytest.raises(ValueError, match="config.json.*moe_intermediate_size"):
        ModelConfig.from_hf_dict(missing)
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig.from_hf_dict({**d, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict({**d, "num_experts_per_tok": 17})
    with pytest.raises(ValueError, match="hidden_size"):
        tiny(hidden_size=0)
    # Unknown HF keys are ignored; a sliding window that is off is dropped, as HF does.
    loaded = ModelConfig.from_hf_dict({**d, "max_window_layers": 4, "sliding_window": 4096})
    assert loaded == tiny() and loaded.sliding_window is None


def test_head_dim_defaults_like_hf():
    d = tiny().to_hf_dict()
    del d["head_dim"]
    assert ModelConfig.from_hf_dict(d).head_dim == d["hidden_size"] // d["num_attention_heads"]


def test_model_config_from_configdict_lists():
    cd = load_config("tiny").model
    cd.mlp_only_layers = [0, 2]
    cfg = model_config_from(cd)
    assert cfg.mlp_only_layers == (0, 2) and hash(cfg) == hash(tiny(mlp_only_layers=(0, 2)))
    assert ModelConfig(**load_config("tiny").model) == tiny()


def test_is_moe_layer_rule():
    cfg = tiny(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=(3,))
    assert cfg.moe_layers == (1, 5) and cfg.num_moe_layers == 2
    assert tiny(num_experts=0, num_experts_per_tok=2).moe_layers == ()


@pytest.mark.parametrize("name", REAL)
def test_real_configs_match_published_sizes(name):
    config = load_config(name)
    counts = param_counts(model_config_from(config.model))
    assert abs(counts["total"] / (config.published_params_b * 1e9) - 1) < 0.02
    assert abs(counts["active"] / (config.published_active_b * 1e9) - 1) < 0.02
    assert load_config(name, "gpu").mesh.expert == 8


# -- against transformers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers


@pytest.mark.parametrize("name", ["tiny", *REAL])
def test_hf_round_trip(hf, name):
    cfg = model_config_from(load_config(name).model)
    hf_config = hf.Qwen3MoeConfig.from_dict(cfg.to_hf_dict())
    assert hf_config.num_experts == cfg.num_experts and hf_config.head_dim == cfg.head_dim
    back = ModelConfig.from_hf_dict(hf_config.to_dict(), param_dtype=cfg.param_dtype,
                                    compute_dtype=cfg.compute_dtype, remat=cfg.remat,
                                    scan_layers=cfg.scan_layers)
    assert back == cfg
    # and through a saved config.json + AutoConfig
    auto = hf.AutoConfig.for_model(**json.loads(json.dumps(cfg.to_hf_dict())))
    assert type(auto).__name__ == "Qwen3MoeConfig"
    assert ModelConfig.from_hf_dict(json.loads(auto.to_json_string()),
                                    param_dtype=cfg.param_dtype,
                                    compute_dtype=cfg.compute_dtype, remat=cfg.remat,
                                    scan_layers=cfg.scan_layers) == cfg


def _hf_model(hf, cfg: ModelConfig):
    import torch
    torch.manual_seed(0)
    return hf.Qwen3MoeForCausalLM(hf.Qwen3MoeConfig.from_dict(cfg.to_hf_dict()))


def test_is_moe_layer_matches_transformers(hf):
    cfg = tiny(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=(3,), vocab_size=64)
    model = _hf_model(hf, cfg)
    sparse = hf.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock
    hf_moe = [isinstance(layer.mlp, sparse) for layer in model.model.layers]
    assert hf_moe == [cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)]
    assert sum(hf_moe) == cfg.num_moe_layers == 2


@pytest.mark.parametrize("kw", [dict(), dict(tie_word_embeddings=False),
                                dict(attention_bias=True, decoder_sparse_step=2, head_dim=24)])
def test_param_counts_match_transformers(hf, kw):
    cfg = tiny(**kw)
    model = _hf_model(hf, cfg)
    counts = param_counts(cfg)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    lm = model.lm_head.weight.numel()
    assert counts["embedding"] == model.model.embed_tokens.weight.numel() == lm
    assert counts["lm_head"] == (0 if cfg.tie_word_embeddings else lm)
    moe = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n
              or ".mlp.gate." in n)
    assert counts["moe"] == moe


# -- Qwen3.5-MoE (qwen3_5_moe_text) ---------------------------------------------------------------

QWEN3_5 = ("qwen3_5_35b_a3b", "qwen3_5_122b_a10b")


@pytest.mark.parametrize("name", QWEN3_5)
def test_qwen3_5_configs_match_published_sizes(name):
    """Qwen's cards give Qwen3.5 sizes in whole billions ("35B in total and 3B activated"). Our
    text-only totals are within 1% (the vision tower and MTP head are not counted); the active
    counts are only as exact as that rounding (35B-A3B: 3.46B, +15%), so they are compared in
    whole billions."""
    config = load_config(name)
    cfg = model_config_from(config.model)
    assert cfg.model_type == "qwen3_5_moe_text" and cfg.hybrid
    assert cfg.attention_layers == tuple(range(3, cfg.num_hidden_layers, 4))
    assert ModelConfig(**config.model) == cfg
    counts = param_counts(cfg)
    assert abs(counts["total"] / (config.published_params_b * 1e9) - 1) < 0.03
    assert round(counts["total"] / 1e9) == config.published_params_b
    assert round(counts["active"] / 1e9) == config.published_active_b


def _mesh_devices(devices: str) -> int:
    """JAX devices of a mesh's hardware: TPU v5p-N has N TensorCores, two per chip, one device
    per chip; "8xH200" is 8 GPUs."""
    if devices.startswith("tpu v5p-"):
        return int(devices.removeprefix("tpu v5p-")) // 2
    return int(devices.split("x")[0])


@pytest.mark.parametrize("arg", [None, "gpu"])
@pytest.mark.parametrize("name", [*REAL, *QWEN3_5])
def test_real_config_meshes_fit_devices_and_shapes(name, arg):
    config = load_config(name, arg)
    cfg, m = model_config_from(config.model), config.mesh
    assert m.data * m.fsdp * m.expert * m.tensor == _mesh_devices(m.devices)
    assert cfg.num_experts % m.expert == 0 and cfg.hidden_size % m.fsdp == 0


def test_qwen3_5_35b_shapes_are_transformers_defaults(hf):
    """transformers' Qwen3_5MoeTextConfig defaults are Qwen3.5-35B-A3B's shapes; its RoPE base,
    context length and token ids are the checkpoint's, not HF's defaults."""
    ours = model_config_from(load_config("qwen3_5_35b_a3b").model)
    keep = ("rope_theta", "max_position_embeddings", "bos_token_id", "eos_token_id",
            "pad_token_id", "param_dtype", "compute_dtype", "remat", "scan_layers")
    default = ModelConfig.from_hf_dict(hf.Qwen3_5MoeTextConfig().to_dict(),
                                       **{k: getattr(ours, k) for k in keep})
    assert default == ours


@pytest.mark.parametrize("name", QWEN3_5)
def test_qwen3_5_configs_round_trip_through_transformers(hf, name):
    cfg = model_config_from(load_config(name).model)
    hf_config = hf.Qwen3_5MoeTextConfig.from_dict(cfg.to_hf_dict())
    assert hf_config.layer_types == list(cfg.layer_types)
    assert hf_config.linear_num_value_heads == cfg.linear_num_value_heads
    back = ModelConfig.from_hf_dict(hf_config.to_dict(), param_dtype=cfg.param_dtype,
                                    compute_dtype=cfg.compute_dtype, remat=cfg.remat,
                                    scan_layers=cfg.scan_layers)
    assert back == cfg


def _random_qwen3_5(hf, seed: int):
    """A tiny Qwen3.5-MoE text config where every shape that enters the count is drawn at
    random, with explicit layer types (at least one of each)."""
    rng = random.Random(seed)
    layers = rng.randint(2, 5)
    types = ["linear_attention", "full_attention"]
    types += [rng.choice(types) for _ in range(layers - 2)]
    rng.shuffle(types)
    kv_heads, k_heads, experts = rng.choice([1, 2]), rng.choice([1, 2, 3]), rng.randint(2, 6)
    return hf.Qwen3_5MoeTextConfig(
        vocab_size=rng.choice([32, 48, 64]), hidden_size=rng.choice([16, 24, 32]),
        num_hidden_layers=layers, layer_types=types, num_key_value_heads=kv_heads,
        num_attention_heads=kv_heads * rng.choice([1, 2, 3]), head_dim=rng.choice([8, 16]),
        moe_intermediate_size=rng.choice([8, 12, 20]),
        shared_expert_intermediate_size=rng.choice([8, 24]), num_experts=experts,
        num_experts_per_tok=rng.randint(1, experts), linear_num_key_heads=k_heads,
        linear_num_value_heads=k_heads * rng.choice([1, 2]),
        linear_key_head_dim=rng.choice([4, 8]), linear_value_head_dim=rng.choice([4, 6, 8]),
        linear_conv_kernel_dim=rng.choice([2, 3, 4]), tie_word_embeddings=seed % 2 == 1,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0,
                         "partial_rotary_factor": 0.25})


@pytest.mark.parametrize("seed", range(4))
def test_qwen3_5_param_counts_match_transformers(hf, seed):
    import torch
    hf_config = _random_qwen3_5(hf, seed)
    cfg = ModelConfig.from_hf_dict(hf_config.to_dict())
    assert cfg.hybrid and cfg.layer_types == tuple(hf_config.layer_types)
    torch.manual_seed(0)
    model = hf.Qwen3_5MoeForCausalLM(hf_config)
    named = dict(model.named_parameters())  # a tied head appears once

    def part(*keys):
        return sum(p.numel() for n, p in named.items() if any(k in n for k in keys))

    counts = param_counts(cfg)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["embedding"] == model.model.embed_tokens.weight.numel()
    assert counts["lm_head"] == (0 if cfg.tie_word_embeddings else model.lm_head.weight.numel())
    assert counts["attention"] == part(".self_attn.") - part(".q_norm.", ".k_norm.")
    assert counts["linear_attention"] == part(".linear_attn.") - part(".linear_attn.norm.")
    assert counts["moe"] == part(".mlp.experts.", ".mlp.gate.")
    assert counts["shared_expert"] == part(".mlp.shared_expert")  # and shared_expert_gate
    assert counts["norms"] == part("norm")
    unchosen = part(".mlp.experts.") // cfg.num_experts * (cfg.num_experts
                                                            - cfg.num_experts_per_tok)
    assert counts["active"] == counts["total"] - unchosen
