"""The model's shape and options: one frozen `ModelConfig`, read from and written to HF's
config.json, for the two families t1jax implements:

- `qwen3_moe` (Qwen3MoeForCausalLM): every layer full attention, routed experts;
- `qwen3_5_moe_text` (Qwen3_5MoeForCausalLM, the text model of Qwen3.5-MoE, T1's base): a
  pattern of Gated DeltaNet (linear attention) and gated full-attention layers with partial
  RoPE, zero-centred RMSNorms, and a gated shared expert beside the routed ones. A checkpoint's
  multimodal `qwen3_5_moe` config.json is read through its `text_config`.

Why: the policy must load real checkpoints and write ones transformers can load, so the field
names and defaults are HF's, and anything our model would silently get wrong (another
architecture, scaled RoPE, sliding windows, another activation) fails loudly here, before any
weights are touched. The last four fields are t1jax's own (dtypes, MoE dispatch, aux loss) and
never come from a config.json.

One module at ~460 lines: the dataclass, its checks and the config.json reading and writing are
one mapping, field by field (HF's name, its default, the check that refuses what our model would
get wrong), kept together so a field is added in one place. What the shapes add up to (parameter
counts) is t1jax/model/sizes.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

QWEN3_MOE, QWEN3_5_MOE = "qwen3_moe", "qwen3_5_moe_text"
ARCHITECTURES = {QWEN3_MOE: "Qwen3MoeForCausalLM", QWEN3_5_MOE: "Qwen3_5MoeForCausalLM"}
# what Qwen3.5 checkpoints on the Hub say (the vision-language wrapper around the text model)
QWEN3_5_WRAPPER = ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")
LAYER_TYPES = ("full_attention", "linear_attention")
DTYPES = ("float32", "bfloat16", "float16")

# A config.json without these is not a config we can trust: no defaults are guessed.
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
             "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "num_experts_per_tok")
_REQUIRED_QWEN3_5 = ("vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "num_experts_per_tok",
                     "num_experts", "head_dim", "shared_expert_intermediate_size",
                     "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                     "linear_num_key_heads", "linear_num_value_heads")
# t1jax-only fields: set by our configs (or from_hf_dict's overrides), never read from HF.
MOE_SHARDINGS = ("gather_weights", "gather_tokens")  # t1jax/model/expert_sharding.py
_T1JAX_FIELDS = ("param_dtype", "compute_dtype", "moe_dispatch", "load_balancing_coef", "remat",
                 "attention", "attention_block", "causal_query_blocks", "moe_token_chunk",
                 "scan_layers", "moe_sharding", "offload_layer_inputs")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters named as in transformers' Qwen3MoeConfig / Qwen3_5MoeTextConfig."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # FFN width of the dense (mlp_only / non-sparse) layers
    moe_intermediate_size: int  # FFN width of each expert
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    num_experts: int
    num_experts_per_tok: int
    head_dim: int | None = None  # None: hidden_size // num_attention_heads (HF's default)
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    router_aux_loss_coef: float = 0.001
    use_sliding_window: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    # Qwen3.5-MoE (model_type qwen3_5_moe_text); the defaults are Qwen3-MoE's behaviour
    model_type: str = QWEN3_MOE
    layer_types: tuple[str, ...] = ()  # () = every layer full attention
    partial_rotary_factor: float = 1.0  # RoPE on the first head_dim * factor dims
    shared_expert_intermediate_size: int = 0  # 0 = no shared expert
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # t1jax-only
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    moe_dispatch: str = "auto"
    load_balancing_coef: float = 0.0
    # Recompute each decoder layer in the backward pass (training forwards only): activations
    # kept per layer drop to its input, and FSDP-gathered weights are not held across layers.
    remat: bool = False
    # "auto" | "flash" | "naive" (transformer.use_flash): flash keeps attention memory O(S)
    attention: str = "auto"
    attention_block: int = 512
    # the naive path on cacheless rows scores each of this many query blocks against the keys
    # up to its end only (transformer.attend_causal); 1: the whole [S, S] matrix
    causal_query_blocks: int = 4
    # the expert FFN runs over at most this many tokens per device at a time (bounded buffers)
    moe_token_chunk: int = 8192
    # how a mesh brings tokens and experts together (t1jax/model/expert_sharding.py):
    # "gather_weights" (each layer's experts gathered whole) | "gather_tokens" (expert parallel)
    moe_sharding: str = "gather_weights"
    # The repeating layers' parameters are stored stacked (one array per block position, a
    # leading layer axis: Transformer.blocks) and training forwards run them under lax.scan:
    # one layer's program, compiled once, at most about one layer's weights and buffers in
    # flight (unrolled, XLA's scheduler runs weight gathers far ahead), and per-parameter work
    # (optimizer, norms) on a few arrays instead of one per layer. HF checkpoints still load
    # and export layer by layer (t1jax.model.hf_io); the engine runs the layers one by one
    scan_layers: bool = False
    # With remat: the one activation each layer keeps for its backward pass (its input, bf16
    # [rows, length, hidden]) waits in host memory (pinned_host) instead of HBM: a 94-layer
    # 32k-token row's 25 GB per chip move off the chip, copied back a layer at a time
    offload_layer_inputs: bool = False

    def __post_init__(self):
        # Normalize containers so configs built from JSON / ConfigDict lists compare and hash equal.
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
        types = tuple(str(t) for t in self.layer_types)
        if not types or (self.model_type == QWEN3_MOE and set(types) == {"full_attention"}):
            types = ("full_attention",) * int(self.num_hidden_layers)  # follows `replace`
        set_("layer_types", types)
        set_("partial_rotary_factor", float(self.partial_rotary_factor))
        if isinstance(self.eos_token_id, (list, tuple)):
            set_("eos_token_id", tuple(int(i) for i in self.eos_token_id))
        if self.head_dim is None and self.num_attention_heads:
            set_("head_dim", self.hidden_size // self.num_attention_heads)
        if not self.use_sliding_window:
            set_("sliding_window", None)  # as HF: the window only exists when it is used
        for k in ("rms_norm_eps", "rope_theta", "router_aux_loss_coef", "load_balancing_coef"):
            set_(k, float(getattr(self, k)))
        self._validate()

    def _validate(self) -> None:
        for k in ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                  "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "num_experts_per_tok", "decoder_sparse_step", "max_position_embeddings"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{k} must be a positive int, got {v!r}")
        if not isinstance(self.num_experts, int) or self.num_experts < 0:
            raise ValueError(f"num_experts must be an int >= 0, got {self.num_experts!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be divisible "
                             f"by num_key_value_heads ({self.num_key_value_heads})")
        if self.num_experts and self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be <= "
                             f"num_experts ({self.num_experts})")
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"mlp_only_layers {bad} are outside 0..{self.num_hidden_layers - 1}")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act={self.hidden_act!r} is not supported (only 'silu')")
        if self.use_sliding_window:
            raise ValueError("use_sliding_window=True is not supported: t1jax attends over the "
                             "full context (Qwen3-MoE checkpoints ship use_sliding_window=false)")
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"model_type={self.model_type!r}; supported: "
                             f"{', '.join(ARCHITECTURES)}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for "
                             f"{self.num_hidden_layers} layers")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"layer_types {bad} unknown; supported: {', '.join(LAYER_TYPES)}")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(f"partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1]")
        if self.rotary_dim % 2:
            raise ValueError(f"head_dim * partial_rotary_factor = {self.rotary_dim} must be even")
        if self.hybrid:
            self._validate_qwen3_5()
        elif (self.linear_layers or self.shared_expert_intermediate_size
              or self.partial_rotary_factor != 1.0):
            raise ValueError("linear attention, a shared expert and partial RoPE are Qwen3.5-MoE "
                             f"features; set model_type={QWEN3_5_MOE!r}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be > 0")
        for k in ("param_dtype", "compute_dtype"):
            if getattr(self, k) not in DTYPES:
                raise ValueError(f"{k}={getattr(self, k)!r}; supported: {', '.join(DTYPES)}")
        if self.attention not in ("auto", "flash", "naive"):
            raise ValueError(f"attention must be 'auto', 'flash' or 'naive', got {self.attention!r}")
        if not isinstance(self.moe_token_chunk, int) or self.moe_token_chunk <= 0:
            raise ValueError(f"moe_token_chunk must be a positive int, got {self.moe_token_chunk!r}")
        if self.offload_layer_inputs and not self.remat:
            raise ValueError("offload_layer_inputs needs remat=True: it is a remat policy (the "
                             "saved layer inputs go to host memory)")
        if self.moe_sharding not in MOE_SHARDINGS:
            raise ValueError(f"moe_sharding must be one of {MOE_SHARDINGS}, got "
                             f"{self.moe_sharding!r}")
        if not isinstance(self.attention_block, int) or self.attention_block <= 0:
            raise ValueError(f"attention_block must be a positive int, got {self.attention_block!r}")
        if not isinstance(self.causal_query_blocks, int) or self.causal_query_blocks <= 0:
            raise ValueError(f"causal_query_blocks must be a positive int, got "
                             f"{self.causal_query_blocks!r}")
        if not isinstance(self.moe_dispatch, str) or not self.moe_dispatch:
            raise ValueError(f"moe_dispatch must be a non-empty string, got {self.moe_dispatch!r}")

    def _validate_qwen3_5(self) -> None:
        for k in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                  "linear_num_key_heads", "linear_num_value_heads",
                  "shared_expert_intermediate_size", "num_experts"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{k} must be a positive int for {QWEN3_5_MOE}, got {v!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads ({self.linear_num_value_heads}) must be "
                             f"divisible by linear_num_key_heads ({self.linear_num_key_heads})")
        # every Qwen3.5-MoE layer is sparse, and its router always renormalises the top-k
        if self.mlp_only_layers or self.decoder_sparse_step != 1 or not self.norm_topk_prob:
            raise ValueError(f"{QWEN3_5_MOE} has no dense layers and normalised top-k weights: "
                             "need mlp_only_layers=(), decoder_sparse_step=1, norm_topk_prob=True")
        if self.attention_bias:
            raise ValueError(f"attention_bias=True is not supported for {QWEN3_5_MOE}")

    # -- layer layout -------------------------------------------------------------------------

    @property
    def hybrid(self) -> bool:
        """Qwen3.5-MoE: gated attention, zero-centred norms, shared expert, linear layers."""
        return self.model_type == QWEN3_5_MOE

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_linear_layer(self, i: int) -> bool:
        return self.layer_types[i] == "linear_attention"

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_linear_layer(i))

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if not self.is_linear_layer(i))

    def is_moe_layer(self, i: int) -> bool:
        """Exactly Qwen3MoeDecoderLayer's rule for using the sparse MoE block at layer i."""
        return ((i not in self.mlp_only_layers) and self.num_experts > 0
                and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_moe_layer(i))

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    # -- HF config.json -----------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], source: str = "config.json",
                     **overrides) -> ModelConfig:
        """A config from an HF config dict; unknown keys are ignored (HF configs carry many).

        `overrides` set fields directly (typically the t1jax-only dtype/dispatch fields, which a
        config.json does not describe: its `dtype` is how the checkpoint is stored).
        """
        def fail(msg: str) -> ValueError:
            return ValueError(f"{source}: {msg}")

        model_type = d.get("model_type")
        archs = d.get("architectures") or []
        if isinstance(archs, str):
            archs = [archs]
        if model_type == QWEN3_5_WRAPPER[0] or QWEN3_5_WRAPPER[1] in archs:
            text = d.get("text_config")
            if not isinstance(text, Mapping):
                raise fail(f"model_type={QWEN3_5_WRAPPER[0]!r} needs a 'text_config' dict")
            d = {"model_type": QWEN3_5_MOE, **text,
                 "tie_word_embeddings": d.get("tie_word_embeddings",
                                              text.get("tie_word_embeddings", False))}
            model_type, archs = QWEN3_5_MOE, []
        if model_type is None:  # an old config.json: judge by its architecture
            model_type = next((t for t, a in ARCHITECTURES.items() if a in archs), QWEN3_MOE)
        if model_type not in ARCHITECTURES:
            raise fail(f"model_type={model_type!r} is not supported; t1jax supports "
                       + ", ".join(f"{t!r} ({a})" for t, a in ARCHITECTURES.items()))
        other = [a for a in archs if a != ARCHITECTURES[model_type]]
        if other:
            raise fail(f"architectures={list(archs)!r} does not match model_type={model_type!r} "
                       f"(expected [{ARCHITECTURES[model_type]!r}])")

        hybrid = model_type == QWEN3_5_MOE
        kw: dict[str, Any] = {"model_type": model_type}
        for k in _REQUIRED_QWEN3_5 if hybrid else _REQUIRED:
            if d.get(k) is None:
                raise fail(f"required field {k!r} is missing")
            kw[k] = d[k]
        if hybrid:
            kw["intermediate_size"] = kw["moe_intermediate_size"]  # unused: no dense layers
            kw["norm_topk_prob"] = True  # Qwen3.5's router always renormalises its top-k
            if d.get("layer_types") is not None:
                kw["layer_types"] = tuple(d["layer_types"])
            else:  # HF's default pattern: every `full_attention_interval`-th layer is full
                every = int(d.get("full_attention_interval", 4))
                kw["layer_types"] = tuple(
                    "full_attention" if (i + 1) % every == 0 else "linear_attention"
                    for i in range(int(d["num_hidden_layers"])))
            kw["partial_rotary_factor"] = _partial_rotary_factor(d, fail)
        else:
            if d.get("num_experts") is not None:  # real Qwen3 checkpoints
                kw["num_experts"] = d["num_experts"]
            elif d.get("num_local_experts") is not None:  # what transformers 5 writes
                kw["num_experts"] = d["num_local_experts"]
            else:
                raise fail("required field 'num_experts' (or 'num_local_experts') is missing")
            if d.get("head_dim") is not None:
                kw["head_dim"] = d["head_dim"]
            if d.get("mlp_only_layers") is not None:
                kw["mlp_only_layers"] = tuple(d["mlp_only_layers"])
            for k in ("norm_topk_prob", "decoder_sparse_step"):
                if d.get(k) is not None:
                    kw[k] = d[k]
        kw["rope_theta"] = _rope_theta(d, fail, partial_ok=hybrid)
        for k in ("rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                  "attention_bias", "hidden_act", "router_aux_loss_coef", "use_sliding_window",
                  "sliding_window", "bos_token_id", "eos_token_id", "pad_token_id"):
            if d.get(k) is not None:
                kw[k] = d[k]
        if d.get("use_sliding_window"):
            raise fail("use_sliding_window=true is not supported (t1jax attends over the full "
                       "context)")
        if d.get("hidden_act", "silu") != "silu":
            raise fail(f"hidden_act={d['hidden_act']!r} is not supported (only 'silu')")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown ModelConfig field(s) in overrides: {sorted(unknown)}")
        kw.update(overrides)
        try:
            return cls(**kw)
        except ValueError as err:
            raise fail(str(err)) from None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides) -> ModelConfig:
        """Reads `<path>/config.json`, or `path` itself when it is a file."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        with open(p) as f:
            return cls.from_hf_dict(json.load(f), source=str(p), **overrides)

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json dict that transformers' AutoConfig loads back to the same values
        (written with both `rope_theta` and `rope_parameters`, as each HF version reads one)."""
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "hidden_act": self.hidden_act,
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                             else self.eos_token_id),
            "pad_token_id": self.pad_token_id,
            "dtype": self.param_dtype,  # how saved weights are stored
        }
        if self.hybrid:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
            d.update({
                "layer_types": list(self.layer_types),
                "partial_rotary_factor": self.partial_rotary_factor,
                "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
                "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
                "linear_key_head_dim": self.linear_key_head_dim,
                "linear_value_head_dim": self.linear_value_head_dim,
                "linear_num_key_heads": self.linear_num_key_heads,
                "linear_num_value_heads": self.linear_num_value_heads,
            })
        else:
            d.update({
                "intermediate_size": self.intermediate_size,
                "norm_topk_prob": self.norm_topk_prob,
                "decoder_sparse_step": self.decoder_sparse_step,
                "mlp_only_layers": list(self.mlp_only_layers),
                "use_sliding_window": self.use_sliding_window,
                "sliding_window": self.sliding_window,
            })
        return d


# A rope dict's `mrope_section` / `mrope_interleaved` (Qwen3.5) are ignored on purpose: the
# multimodal RoPE splits the rotary dims into (time, height, width) sections, but a text token
# has the same position on all three, which is plain RoPE.


def _rope_theta(d: Mapping[str, Any], fail, partial_ok: bool = False) -> float:
    """rope_theta from `rope_scaling` / `rope_parameters` / top level, rejecting scaled RoPE.

    Priority as in transformers: rope_scaling replaces rope_parameters, whose rope_theta wins
    over the top-level one; absent everywhere: HF's default 10000.
    """
    theta = d.get("rope_theta")
    field, rope = _rope_dict(d, fail)
    if rope is not None:
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise fail(f"{field}.rope_type={rope_type!r} is not supported; t1jax implements "
                       f"only rope_type='default' (unscaled RoPE)")
        if not partial_ok and rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise fail(f"{field}.partial_rotary_factor={rope['partial_rotary_factor']!r} is not "
                       f"supported (only 1.0)")
        if rope.get("rope_theta") is not None:
            theta = rope["rope_theta"]
    if not partial_ok and d.get("partial_rotary_factor", 1.0) not in (None, 1.0):
        raise fail(f"partial_rotary_factor={d['partial_rotary_factor']!r} is not supported")
    return float(theta if theta is not None else 10_000.0)


def _rope_dict(d: Mapping[str, Any], fail) -> tuple[str | None, Mapping[str, Any] | None]:
    """(field, dict) of the rope dict that applies: rope_scaling, when present, replaces
    rope_parameters."""
    for field in ("rope_scaling", "rope_parameters"):
        rope = d.get(field)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise fail(f"{field}={rope!r} is not a dict")
        return field, rope
    return None, None


def _partial_rotary_factor(d: Mapping[str, Any], fail) -> float:
    """Qwen3.5's fraction of rotary head dims: the rope dict's, else the top level's, else HF's
    default 0.25."""
    rope = _rope_dict(d, fail)[1] or {}
    factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    return float(0.25 if factor is None else factor)


def model_config_from(cd: Any) -> ModelConfig:
    """A ModelConfig from a ConfigDict (or dict) of its fields; lists become tuples."""
    d = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"unknown ModelConfig field(s): {sorted(unknown)}")
    return ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
