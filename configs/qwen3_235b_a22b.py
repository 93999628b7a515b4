"""The recipe on Qwen3-235B-A22B: the Qwen3-30B-A3B run's settings (configs/qwen3_30b_a3b.py:
32k-token rows, 4 minibatches, the same fleet protocol) with the 235B model on a TPU v5p-256
trainer (128 chips: data 1 x fsdp 16 x expert 8).

Why v5p-256: PPO holds two 235B models (actor and critic) with fp32 Adam moments, 10 bytes per
parameter each, 4.7 TB; on v5p-128 (64 chips x 95 GB) that alone is 73 GB per chip before the
gradients and a 32k-token row's activations. On 128 chips it is 37 GB.
`.venv-tpu/bin/python experiments/run.py --config configs/qwen3_235b_a22b.py
--workdir runs/aot_235b --config.phases=aot` compiles its steps for that topology (32 hosts)
through the recipe's driver (BUILD.md has the numbers).
Launch as configs/qwen3_30b_a3b.py's docstring shows (the same recipe driver and phases), with
this file and the 235B checkpoint (`--config.init.hf_path=/shared/Qwen3-235B-A22B`,
`--config.rollouts.tokenizer=...`).
"""

import ml_collections

from configs import qwen3_30b_a3b
from configs.common import check_variant
from configs.model import qwen3_235b_a22b


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("qwen3_235b_a22b", arg)
    config = qwen3_30b_a3b.get_config()
    config.model = qwen3_235b_a22b.get_config().model
    config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=16, expert=8, tensor=1,
                                                 devices="tpu v5p-256"))
    config.aot.topology, config.aot.mesh = "v5p:4x4x8", ""  # the fit check: this mesh, 32 hosts
    # what a 32k-token row per chip needs on top of remat and scan_layers (BUILD.md, "Ahead-of-
    # time TPU checks"): the 94 saved layer inputs (25 GB per chip) wait in host memory, and the
    # experts stay on their expert-axis chips while tokens travel a chunk at a time
    config.model.offload_layer_inputs = True
    config.model.moe_sharding = "gather_tokens"
    config.rollouts.tokenizer = "/shared/Qwen3-235B-A22B/tokenizer.json"
    config.init.hf_path = "/shared/Qwen3-235B-A22B"
    return config
