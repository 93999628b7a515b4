"""Qwen3.5-35B-A3B, text model (Qwen/Qwen3.5-35B-A3B config.json `text_config`): 40 layers,
10 x (3 Gated DeltaNet + 1 gated attention), 256 experts top-8 + a gated shared expert.

  python experiments/param_count.py configs/model/qwen3_5_35b_a3b.py       # TPU v5p-128 mesh
  python experiments/param_count.py configs/model/qwen3_5_35b_a3b.py:gpu   # 8xH200 mesh

Shapes: transformers' Qwen3_5MoeTextConfig defaults, which are this checkpoint's
(models/qwen3_5_moe/configuration_qwen3_5_moe.py, `@auto_docstring(checkpoint=
"Qwen/Qwen3.5-35B-A3B")`); THUDM/slime scripts/models/qwen3.5-35B-A3B.sh and pytorch/torchtitan
torchtitan/models/qwen3_5/flavors.py (`_35b_a3b`) agree field by field. Not HF defaults: rope_theta
1e7 (HF: 1e4; slime's --rotary-base and torchtitan's theta say 1e7) and max_position_embeddings
262144 (HF: 32768; the card's 262K native context).

Token ids (Qwen3.5 tokenizer: <|endoftext|> 248044, <|im_start|> 248045, <|im_end|> 248046):
bos/pad 248044 and eos (248046, 248044) as the checkpoints' generation_config.json, so a
rollout stops at the end of a chat turn. The Hub config.json's text_config says eos 248044 and
bos null instead, so ModelConfig.from_pretrained(checkpoint) differs from this file only there.

Sizes: 34.66B text parameters, 3.46B active (embedding and head counted, as for Qwen3). The card's
"35B total, 3B activated" are names rounded to whole billions: the total also fits text + vision
tower (0.45B) = 35.1B; the 0.84B MTP head is counted by neither; and 3.46B active is "A3B" only
after rounding (+15%), which is why the test compares whole billions for the active count.

Memory: full fine-tuning with bf16 params and grads and fp32 Adam moments (~12 bytes/param) is
~420 GB plus activations. Decoding state per sequence: a KV cache only in the 10 attention layers
(2 KV heads x 256 x K,V x bf16 = 2 KB/token/layer: 20 KB/token, 5.4 GB at 262K tokens) plus a
fixed 63 MB of fp32 DeltaNet state (30 layers x 32 heads x 128 x 128).
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(dict(
        vocab_size=248320,
        hidden_size=2048,
        intermediate_size=512,  # unused (no dense layers); from_hf_dict sets moe_intermediate_size
        moe_intermediate_size=512,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        num_experts=256,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=(),
        rms_norm_eps=1e-6,
        rope_theta=10_000_000.0,
        max_position_embeddings=262144,
        tie_word_embeddings=False,
        attention_bias=False,
        hidden_act="silu",
        router_aux_loss_coef=0.001,
        use_sliding_window=False,
        sliding_window=None,
        bos_token_id=248044,
        eos_token_id=(248046, 248044),
        pad_token_id=248044,
        model_type="qwen3_5_moe_text",
        # HF's full_attention_interval=4: every 4th layer is full attention
        layer_types=(("linear_attention",) * 3 + ("full_attention",)) * 10,
        partial_rotary_factor=0.25,
        shared_expert_intermediate_size=512,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        param_dtype="bfloat16",
        compute_dtype="bfloat16",
        moe_dispatch="auto",
        load_balancing_coef=0.0,
        remat=True,  # recompute each layer in the backward: long rows fit (t1jax/jobs/aot.py)
        scan_layers=True,  # repeating layers stored stacked, run under lax.scan
    ))
    if arg in (None, "", "tpu"):
        # v5p-128 = 64 chips (one JAX device per megacore chip), 95 GB HBM each, as for
        # Qwen3-30B-A3B. expert=8: 32 experts per shard, each layer gathers its experts from 8
        # chips. fsdp=8: `embed` is on fsdp, so the 32.2B expert params are split 64 ways (~6
        # GB/chip with Adam state) and the 2.4B others 8 ways (~4 GB/chip): ~10 GB of 95 GB
        # before activations. tensor=1: at hidden 2048 the matmuls are too small for tensor
        # parallelism's all-reduces to pay off. The batch is split over all three axes.
        config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=8, expert=8, tensor=1,
                                                     devices="tpu v5p-128"))
    elif arg == "gpu":
        # 8 GPUs on NVLink: experts 8-way (32 per GPU: 4.0B params, ~48 GB with Adam state);
        # with fsdp=1 the 2.4B non-expert params are replicated (~29 GB/GPU more): ~77 GB/GPU
        # before activations. Fits an H200 (141 GB); on an H100 (80 GB) take fsdp=2, expert=4,
        # which keeps experts split 8 ways and halves the replicated part.
        config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, expert=8, tensor=1,
                                                     devices="8xH200"))
    else:
        raise ValueError(f"unknown config arg {arg!r}; use 'tpu' (default) or 'gpu'")
    config.published_params_b = 35.0
    config.published_active_b = 3.0
    return config
