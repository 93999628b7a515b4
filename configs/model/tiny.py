"""A tiny Qwen3-MoE that trains on 2 CPU cores in minutes: for tests, smoke runs and debugging.

Every structural feature of the real models is present at toy size: GQA (8 heads over 2 KV
heads), an explicit head_dim, q/k norms, top-2 of 16 experts, and one dense layer (layer 0, via
mlp_only_layers) so the dense and MoE code paths both run.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,  # the dense layer's FFN
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=16,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=(0,),
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
