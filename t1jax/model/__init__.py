"""The policy and critic network: Qwen3-MoE and Qwen3.5-MoE decoders in Flax NNX, with their
decoding cache and Hugging Face checkpoint I/O.

cache.py: the decoding cache (attention keys/values, linear-attention states, row lengths), so
  rows of one batch can decode at different lengths.
config.py: `ModelConfig`, read from and written to HF's config.json; refuses what the model would
  get wrong before any weights are touched.
dispatch.py: dropless expert computation for a top-k MoE layer, in several strategies (ragged,
  padded, dense, blocked) that compute the same function, as the fastest differs per backend.
expert_sharding.py: the expert FFN inside shard_map on a mesh (gather weights or gather tokens),
  so XLA does not replicate every token's expert work on every chip.
flash_attention.py: blockwise attention with an online softmax and a recomputing backward, so
  long rows never hold the full score matrix.
gated_delta.py: the Gated Delta Rule, Qwen3.5's linear-attention core, in a recurrent (decode)
  and a chunked (training) form.
hf_io.py: HF safetensors to sharded parameters (each host reads only its own slices) and back,
  in the layout transformers loads.
layer_stack.py: the repeating decoder layers stored stacked and run under lax.scan with remat,
  and where layer i's parameters live (for checkpoint import and export).
layers.py: small shared building blocks: parameters with logical axis names, RMSNorm, RoPE, the
  dense SwiGLU MLP, the activation sharding hook.
linear_attention.py: Qwen3.5's Gated DeltaNet token mixer, with q/k/v weights kept apart so its
  heads shard like attention heads.
moe.py: the MoE feed-forward with routing as a value, so recorded rollout routes can be replayed
  (R3) while the router keeps its gradient.
sizes.py: parameter counts (total and active per token) from a config, for FLOP and MFU
  estimates.
transformer.py: the decoder with its two heads, `CausalLM` (the policy) and `ValueModel` (the
  critic), which return the expert routes they used and can replay them.
"""
