"""A tiny Qwen3.5-MoE (the hybrid T1 base) that runs on 2 CPU cores: for tests, smoke runs and
ablations of the architecture at laptop size.

Every structural feature of the real model is present at toy size: 3 Gated DeltaNet layers then
one gated full-attention layer (HF's full_attention_interval 4), grouped linear heads (2 key /
4 value heads), partial RoPE (a quarter of head_dim), GQA (4 heads over 2 KV heads), top-2 of 8
routed experts plus the gated shared expert, zero-centred norms.

  python experiments/param_count.py configs/model/tiny_qwen35.py
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(dict(
        model_type="qwen3_5_moe_text",
        layer_types=("linear_attention",) * 3 + ("full_attention",),
        vocab_size=512,
        hidden_size=128,
        intermediate_size=64,  # unused: every layer is MoE
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        partial_rotary_factor=0.25,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        param_dtype="float32",
        compute_dtype="float32",
        moe_dispatch="auto",
        load_balancing_coef=0.0,
    ))
    config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, expert=1, tensor=1,
                                                 devices="cpu"))
    return config
