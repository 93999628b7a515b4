"""Qwen3.5-122B-A10B, text model (Qwen/Qwen3.5-122B-A10B config.json `text_config`): 48 layers,
12 x (3 Gated DeltaNet + 1 gated attention), 256 experts top-8 + a gated shared expert.

  python experiments/param_count.py configs/model/qwen3_5_122b_a10b.py       # TPU v5p-128 mesh
  python experiments/param_count.py configs/model/qwen3_5_122b_a10b.py:gpu   # 8xH200 mesh

Shapes: the checkpoint's config.json is not in our index of public sources, so they come from
three public re-implementations, which agree on every field they state:
- pytorch/torchtitan torchtitan/models/qwen3_5/flavors.py (`_122b_a10b`): hidden 3072, 48 layers,
  vocab 248320, 32 heads / 2 KV heads of 256, rotary_dim 64 (partial_rotary_factor 0.25),
  theta 1e7, 256 experts top-8 of width 1024, shared expert 1024, DeltaNet 16 key / 64 value
  heads of 128, conv kernel 4, full_attention_interval 4, norm eps 1e-6, untied lm_head;
- Aphoh/slime and Osmosis-AI/miles scripts/models/qwen3.5-122B-A10B.sh (Megatron flags): the same
  layers, hidden, heads / query groups / kv-channels, rotary-percent, vocab, rotary-base, norm
  eps, untied embeddings, expert and shared-expert widths, top-k and expert count; miles adds
  one MTP layer.
max_position_embeddings 262144 is the card's 262K native context (and the 35B's config.json);
router_aux_loss_coef 0.001 is HF's default and torchtitan's / Aphoh's slime's aux loss coef.

Token ids: as in qwen3_5_35b_a3b.py (same tokenizer): bos/pad 248044 <|endoftext|> and eos
(248046 <|im_end|>, 248044) as the checkpoints' generation_config.json.

Sizes: 122.11B text parameters, 9.77B active (embedding and head counted, as for Qwen3). The
card's "122B total, 10B activated" are rounded to whole billions: the total fits text only
(+0.1%) or text + vision tower (0.45B, 122.56B); the MTP head (2.52B, 0.18B of it active) is
counted by neither, and 9.77B active is -2.3%.

Memory: bf16 weights alone are ~245 GB; full fine-tuning with fp32 Adam moments (~12
bytes/param) is ~1.47 TB plus activations. Decoding state per sequence: a KV cache only in the
12 attention layers (2 KV heads x 256 x K,V x bf16 = 2 KB/token/layer: 24 KB/token, 6.4 GB at
262K tokens) plus a fixed 151 MB of fp32 DeltaNet state (36 layers x 64 heads x 128 x 128).
"""

import ml_collections

from configs.model import qwen3_5_35b_a3b


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Same family, tokenizer, layer pattern (3 DeltaNet + 1 attention), RoPE, expert count and
    # top-k as Qwen3.5-35B-A3B; these shapes differ.
    config.model = qwen3_5_35b_a3b.get_config().model
    config.model.update(dict(
        hidden_size=3072,
        intermediate_size=1024,  # unused (no dense layers); from_hf_dict sets moe_intermediate_size
        moe_intermediate_size=1024,
        shared_expert_intermediate_size=1024,
        num_hidden_layers=48,
        layer_types=(("linear_attention",) * 3 + ("full_attention",)) * 12,
        num_attention_heads=32,
        linear_num_value_heads=64,
    ))
    if arg in (None, "", "tpu"):
        # v5p-128 = 64 chips x 95 GB = ~6.1 TB HBM. With expert=8 x fsdp=8 the 116B expert
        # params are split 64 ways (~22 GB/chip with Adam state) and the 6.1B others 8 ways
        # (`embed` -> fsdp; ~9 GB/chip): ~31 GB of 95 GB before activations, so long contexts
        # fit. v5p-64 (fsdp=4) would hold the state too (~62 GB/chip) with less room for
        # activations. tensor=1; if activations dominate, take tensor=2 or 4 from fsdp.
        config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=8, expert=8, tensor=1,
                                                     devices="tpu v5p-128"))
    elif arg == "gpu":
        # Honest limit: 8xH200 = 1.1 TB HBM. The bf16 weights take ~41 GB/GPU (experts 8-way,
        # ~29 GB; the 6.1B non-expert params replicated with fsdp=1, ~12 GB), leaving ~100 GB
        # for KV cache and DeltaNet state: inference / rollouts / scoring fit. Full training
        # (~1.47 TB of state; the experts alone ~174 GB/GPU) does NOT fit on one node: take
        # 32 GPUs (fsdp=4, expert=8: ~62 GB/GPU), offload optimizer state, or train adapters.
        config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, expert=8, tensor=1,
                                                     devices="8xH200"))
    else:
        raise ValueError(f"unknown config arg {arg!r}; use 'tpu' (default) or 'gpu'")
    config.published_params_b = 122.0
    config.published_active_b = 10.0
    return config
