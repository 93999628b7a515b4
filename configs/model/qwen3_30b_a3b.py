"""Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 48 layers, 128 experts, top-8, all MoE.

  python experiments/param_count.py configs/model/qwen3_30b_a3b.py       # TPU v5p-128 mesh
  python experiments/param_count.py configs/model/qwen3_30b_a3b.py:gpu   # 8xH200 mesh

Memory (full fine-tuning, bf16 params and grads, fp32 Adam moments: ~12 bytes/param): 30.5B ->
~370 GB plus activations; the per-device shares for each mesh are worked out below.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,  # unused: no dense layers (mlp_only_layers empty, step 1)
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=(),
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        router_aux_loss_coef=0.001,
        bos_token_id=151643,
        eos_token_id=151645,
        param_dtype="bfloat16",
        compute_dtype="bfloat16",
        moe_dispatch="auto",
        load_balancing_coef=0.0,
        remat=True,  # recompute each layer in the backward: long rows fit (t1jax/jobs/aot.py)
        scan_layers=True,  # repeating layers stored stacked, run under lax.scan
    ))
    if arg in (None, "", "tpu"):
        # v5p-128 = 128 TensorCores = 64 chips (4x4x4, one cube; one JAX device per megacore
        # chip), so the mesh has 64 devices, 95 GB HBM each. expert=8: 16 experts per shard,
        # each layer gathers its experts from 8 chips. fsdp=8: t1jax.sharding puts `embed` on fsdp,
        # so experts are split 64 ways and the rest 8 ways: ~8 GB/chip of params + Adam state.
        # tensor=1: at hidden 2048 the per-layer matmuls are too small for tensor parallelism's
        # all-reduces to pay off. The batch is split over all three axes.
        config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=8, expert=8, tensor=1,
                                                     devices="tpu v5p-128"))
    elif arg == "gpu":
        # 8 GPUs on NVLink: experts 8-way (16 per GPU: 29B/8 params, ~44 GB with Adam state);
        # with fsdp=1 the ~1.5B non-expert params are replicated (~18 GB/GPU more): ~62 GB/GPU
        # before activations. Fits an H200 (141 GB); tight on an H100 (80 GB), where
        # fsdp=2, expert=4 halves the replicated share.
        config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, expert=8, tensor=1,
                                                     devices="8xH200"))
    else:
        raise ValueError(f"unknown config arg {arg!r}; use 'tpu' (default) or 'gpu'")
    config.published_params_b = 30.5
    config.published_active_b = 3.3
    return config
