"""What a model's shapes add up to: parameter counts per part, in total and active per token,
laid out as transformers counts them.

Separate from config.py, which says what a config is: this is arithmetic over a finished config,
read by FLOP and MFU estimates (t1jax/jobs/aot.py, the benchmarks) and checked against
transformers' own models in tests/model/test_model_config.py.
"""

from __future__ import annotations

from t1jax.model.config import ModelConfig


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameter counts from the shapes, laid out as transformers' Qwen3MoeForCausalLM or
    Qwen3_5MoeForCausalLM (text only: a Qwen3.5 checkpoint's vision tower and MTP head are not
    counted).

    Keys: embedding, lm_head (0 when tied), attention (full-attention layers: q/k/v/o and
    biases; Qwen3.5's q_proj is twice as wide, query + output gate), moe (routed experts +
    routers), dense_mlp, norms (layer, q/k, gated and final RMSNorms), total, and active: the
    parameters one token uses, i.e. total minus the unchosen (num_experts - top-k) experts of
    every MoE layer; embedding and head count in full, as in Qwen's published "activated" sizes.
    Qwen3.5 adds linear_attention (Gated DeltaNet projections, conv, dt_bias, A_log) and
    shared_expert (its MLP and sigmoid gate, always active); Qwen3-MoE's keys stay as they were.
    """
    h, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    q_out = 2 * q if cfg.hybrid else q
    attn = h * q_out + 2 * h * kv + q * h
    if cfg.attention_bias:
        attn += q_out + 2 * kv + h
    key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    value_dim = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    conv_dim = 2 * key_dim + value_dim
    linear = (h * conv_dim + h * value_dim + 2 * h * cfg.linear_num_value_heads  # qkv, z, b, a
              + conv_dim * cfg.linear_conv_kernel_dim  # depthwise conv1d
              + 2 * cfg.linear_num_value_heads  # dt_bias, A_log
              + value_dim * h)  # out_proj
    expert = 3 * h * cfg.moe_intermediate_size  # gate, up, down
    router = cfg.num_experts * h
    n_moe = cfg.num_moe_layers
    n_dense = cfg.num_hidden_layers - n_moe
    n_attn, n_linear = len(cfg.attention_layers), len(cfg.linear_layers)
    counts = {
        "embedding": cfg.vocab_size * h,
        "lm_head": 0 if cfg.tie_word_embeddings else cfg.vocab_size * h,
        "attention": n_attn * attn,
    }
    if cfg.hybrid:
        counts["linear_attention"] = n_linear * linear
    counts["moe"] = n_moe * (cfg.num_experts * expert + router)
    if cfg.hybrid:  # gate/up/down of the shared MLP + its 1-wide sigmoid gate
        counts["shared_expert"] = n_moe * (3 * h * cfg.shared_expert_intermediate_size + h)
    counts["dense_mlp"] = n_dense * 3 * h * cfg.intermediate_size
    counts["norms"] = (cfg.num_hidden_layers * 2 * h + n_attn * 2 * hd
                       + n_linear * cfg.linear_value_head_dim + h)
    counts["total"] = sum(counts.values())
    counts["experts_inactive"] = n_moe * (cfg.num_experts - cfg.num_experts_per_tok) * expert
    counts["active"] = counts["total"] - counts.pop("experts_inactive")
    return counts
