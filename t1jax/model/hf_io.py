"""HF safetensors <-> t1jax parameters, tensor by tensor.

Loading builds each parameter with `jax.make_array_from_callback`, so a host reads only the
tensors (and, for sharded parameters, only the slices) that its own devices hold: the whole model
never sits in one host's memory. Export writes the on-disk layout transformers' save_pretrained writes for
Qwen3MoeForCausalLM / Qwen3_5MoeForCausalLM (per-expert `experts.{e}.{gate,up,down}_proj.weight`).
Qwen3.5 checkpoints from the Hub (the multimodal wrapper) keep the text model under
`model.language_model.`; loading finds tensors under either prefix and ignores the rest
(vision tower, multi-token-prediction layers).

Qwen3.5 fuses tensors that t1jax keeps apart so that heads shard alike (see
t1jax.model.linear_attention): `q_proj` holds each head's query then its output gate;
`in_proj_qkv` and `conv1d` hold q, k and v channels one after the other.
"""

from __future__ import annotations

import concurrent.futures

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t1jax.model.config import ModelConfig
from t1jax.model.layer_stack import stored_at


def _linear_map(cfg: ModelConfig, i: int) -> dict:
    """A Qwen3.5 linear-attention layer's token mixer (HF `linear_attn`)."""
    d, hk, hv = cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    p, ours = f"model.layers.{i}.linear_attn.", ("layers", i, "attn")
    cuts = {"q": (0, hk * dk, hk, dk), "k": (hk * dk, 2 * hk * dk, hk, dk),
            "v": (2 * hk * dk, 2 * hk * dk + hv * dv, hv, dv)}
    m = {}
    for name, (lo, hi, heads, dim) in cuts.items():
        m[ours + (name,)] = ([p + "in_proj_qkv.weight"],
                             lambda t, lo=lo, hi=hi, n=heads, k=dim: t[0][lo:hi].T.reshape(d, n, k))
        m[ours + (f"conv_{name}",)] = (
            [p + "conv1d.weight"],
            lambda t, lo=lo, hi=hi, n=heads, k=dim: t[0][lo:hi, 0, :].T.reshape(-1, n, k))
    m.update({
        ours + ("z",): ([p + "in_proj_z.weight"], lambda t: t[0].T.reshape(d, hv, dv)),
        ours + ("b",): ([p + "in_proj_b.weight"], lambda t: t[0].T),
        ours + ("a",): ([p + "in_proj_a.weight"], lambda t: t[0].T),
        ours + ("dt_bias",): ([p + "dt_bias"], lambda t: t[0]),
        ours + ("A_log",): ([p + "A_log"], lambda t: t[0]),
        ours + ("norm", "weight"): ([p + "norm.weight"], lambda t: t[0]),
        ours + ("out",): ([p + "out_proj.weight"], lambda t: t[0].T.reshape(hv, dv, d)),
    })
    return m


def _gated_query(cfg: ModelConfig, half: int):
    """Qwen3.5's q_proj [heads * 2 * head_dim, d]: per head, the query (half 0) then the gate."""
    d, h, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    return lambda t: t[0].reshape(h, 2, hd, d)[:, half].transpose(2, 0, 1)


def _layer_map(cfg: ModelConfig, i: int) -> dict:
    """our param path (within the backbone) -> (hf keys, hf tensors -> our array)."""
    d, h, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    p = f"model.layers.{i}."
    if cfg.is_linear_layer(i):
        m = _linear_map(cfg, i)
        m.update(_norms_and_mlp(cfg, i))
        return m
    m = {
        ("layers", i, "attn", "q"): ([p + "self_attn.q_proj.weight"], lambda t: t[0].T.reshape(d, h, hd)),
        ("layers", i, "attn", "k"): ([p + "self_attn.k_proj.weight"], lambda t: t[0].T.reshape(d, kv, hd)),
        ("layers", i, "attn", "v"): ([p + "self_attn.v_proj.weight"], lambda t: t[0].T.reshape(d, kv, hd)),
        ("layers", i, "attn", "o"): ([p + "self_attn.o_proj.weight"], lambda t: t[0].T.reshape(h, hd, d)),
        ("layers", i, "attn", "q_norm", "weight"): ([p + "self_attn.q_norm.weight"], lambda t: t[0]),
        ("layers", i, "attn", "k_norm", "weight"): ([p + "self_attn.k_norm.weight"], lambda t: t[0]),
    }
    if cfg.hybrid:
        m[("layers", i, "attn", "q")] = ([p + "self_attn.q_proj.weight"], _gated_query(cfg, 0))
        m[("layers", i, "attn", "gate")] = ([p + "self_attn.q_proj.weight"], _gated_query(cfg, 1))
    if cfg.attention_bias:
        for name, heads in (("q", h), ("k", kv), ("v", kv)):
            m[("layers", i, "attn", f"{name}_bias")] = (
                [p + f"self_attn.{name}_proj.bias"], lambda t, n=heads: t[0].reshape(n, hd))
        m[("layers", i, "attn", "o_bias")] = ([p + "self_attn.o_proj.bias"], lambda t: t[0])
    m.update(_norms_and_mlp(cfg, i))
    return m


def _norms_and_mlp(cfg: ModelConfig, i: int) -> dict:
    p = f"model.layers.{i}."
    m = {("layers", i, "input_norm", "weight"): ([p + "input_layernorm.weight"], lambda t: t[0]),
         ("layers", i, "post_attn_norm", "weight"): ([p + "post_attention_layernorm.weight"],
                                                     lambda t: t[0])}
    if cfg.shared_expert_intermediate_size:
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            m[("layers", i, "shared", ours)] = ([p + f"mlp.shared_expert.{theirs}.weight"],
                                                lambda t: t[0].T)
        m[("layers", i, "shared_gate")] = ([p + "mlp.shared_expert_gate.weight"], lambda t: t[0].T)
    if cfg.is_moe_layer(i):
        experts = range(cfg.num_experts)
        m[("layers", i, "mlp", "router")] = ([p + "mlp.gate.weight"], lambda t: t[0].T)
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            keys = [p + f"mlp.experts.{e}.{theirs}.weight" for e in experts]
            m[("layers", i, "mlp", ours)] = (keys, lambda t: np.stack([x.T for x in t]))
    else:
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            m[("layers", i, "mlp", ours)] = ([p + f"mlp.{theirs}.weight"], lambda t: t[0].T)
    return m


def param_map(cfg: ModelConfig, head: str = "lm") -> dict:
    """Every parameter of a CausalLM ('lm') or the backbone of a ValueModel ('value')."""
    m = {("model", "embed"): (["model.embed_tokens.weight"], lambda t: t[0]),
         ("model", "norm", "weight"): (["model.norm.weight"], lambda t: t[0])}
    for i in range(cfg.num_hidden_layers):
        m.update({("model",) + k: v for k, v in _layer_map(cfg, i).items()})
    if head == "lm" and not cfg.tie_word_embeddings:
        m[("lm_head",)] = (["lm_head.weight"], lambda t: t[0].T)
    return m


class _Reader:
    """Lazily opened safetensors files (single file or sharded via the index)."""

    def __init__(self, path: Path):
        from safetensors import safe_open
        index = path / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (path / "model.safetensors").exists():
            with safe_open(path / "model.safetensors", "np") as f:
                weight_map = {k: "model.safetensors" for k in f.keys()}
        else:
            raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
        self.path, self.weight_map, self._open, self._safe_open = path, weight_map, {}, safe_open

    def get(self, key: str) -> np.ndarray:
        if key not in self.weight_map and key.startswith("model."):
            wrapped = "model.language_model." + key[len("model."):]  # a Hub Qwen3.5 checkpoint
            key = wrapped if wrapped in self.weight_map else key
        if key not in self.weight_map:
            raise KeyError(f"{self.path}: checkpoint has no tensor {key!r}")
        file = self.weight_map[key]
        if file not in self._open:
            self._open[file] = self._safe_open(self.path / file, "np")
        return self._open[file].get_tensor(key)


def load_hf(model: nnx.Module, path, head: str = "lm") -> nnx.Module:
    """Fill `model` (already created, possibly sharded, e.g. via sharding.create_sharded or
    nnx.eval_shape) with the checkpoint in `path`; each parameter keeps its sharding."""
    path = Path(path)
    reader = _Reader(path)
    cfg = model.model.cfg
    _, state = nnx.split(model)
    flat = dict(nnx.to_flat_state(state))
    targets = {}  # where each parameter is stored -> its layers' (repeat, hf keys, conversion)
    for key, (hf_keys, convert) in param_map(cfg, head).items():
        stored, r = stored_at(cfg, key)
        targets.setdefault(stored, []).append((r, hf_keys, convert))
    for stored, sources in targets.items():
        if stored not in flat:
            raise KeyError(f"model has no parameter {'/'.join(map(str, stored))}")
        var = flat[stored]
        current = var.get_value()
        stacked = sources[0][0] is not None
        expected = current.shape[1:] if stacked else current.shape

        def layer(hf_keys, convert, expected=expected, dtype=current.dtype):
            full = convert([reader.get(k) for k in hf_keys])
            if full.shape != expected:
                raise ValueError(f"{path}: {hf_keys[0]} gives shape {full.shape}, the model "
                                 f"expects {expected}; does config.json match?")
            return full.astype(dtype)

        sharding = getattr(current, "sharding", None)
        if sharding is None or isinstance(current, jax.ShapeDtypeStruct):
            sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0]) \
                if sharding is None else sharding
        parts = [functools.partial(layer, k, c) for _, k, c in sorted(sources, key=lambda x: x[0])]
        var.set_value(_assemble(current.shape, current.dtype, sharding, parts, stacked))
    nnx.update(model, state)
    return model


def _assemble(shape, dtype, sharding, parts, stacked: bool) -> jax.Array:
    """A (possibly sharded) array from its layers' host tensors, each converted once: this
    host's devices get only their own slices. `stacked`: parts[r] is row r of the leading axis
    (scan_layers' blocks), else parts[0] is the whole array."""
    if not stacked:
        full = parts[0]()
        return jax.make_array_from_callback(shape, sharding, lambda index: full[index])
    indices = sharding.addressable_devices_indices_map(shape)
    rows = {d: range(*index[0].indices(shape[0])) for d, index in indices.items()}
    local = {d: np.empty([len(range(*s.indices(n))) for s, n in zip(index, shape)], dtype)
             for d, index in indices.items()}
    for r, part in enumerate(parts):
        full = part()
        for d, index in indices.items():
            if r in rows[d]:
                local[d][rows[d].index(r)] = full[index[1:]]
    return jax.make_array_from_single_device_arrays(
        shape, sharding, [jax.device_put(local[d], d) for d in indices])


def export_hf(model: nnx.Module, path, dtype: str | None = None,
              max_shard_bytes: int = 4 * 2**30, hub_layout: bool | None = None) -> Path:
    """Write the policy as HF safetensors + config.json (sharded with an index past
    `max_shard_bytes`), loadable by transformers and SGLang's /update_weights_from_disk.

    dtype: what the tensors are stored as (default: the parameters' own, so a bf16 policy is
    published as bf16, half the bytes of a float32 copy). Streamed: each tensor is fetched one
    layer at a time and the files are written shard by shard, so a host never holds more than
    one shard and one tensor, not the model. In a multi-process job every process calls it
    (each tensor is gathered from the devices that hold it): process p writes shards p, p + N,
    ... and process 0 the index and config.json; all return once the folder is complete.

    hub_layout (Qwen3.5 only; default: on for Qwen3.5): write what the Hub's checkpoints hold,
    the text model under `model.language_model.` and a `qwen3_5_moe` config.json wrapping it as
    `text_config` (Qwen3_5MoeForConditionalGeneration), because that is the architecture SGLang
    serves Qwen3.5 as; off: transformers' Qwen3_5MoeForCausalLM layout."""
    from safetensors.numpy import save_file

    from t1jax import distributed
    path = Path(path)
    cfg = model.model.cfg
    hub_layout = cfg.hybrid if hub_layout is None else hub_layout
    if hub_layout and not cfg.hybrid:
        raise ValueError("hub_layout is Qwen3.5's multimodal checkpoint layout; "
                         f"{cfg.model_type} checkpoints have no wrapper")
    processes, me = distributed.process_count(), distributed.process_index()
    if me == 0:
        path.mkdir(parents=True, exist_ok=True)
    distributed.rendezvous("export_hf/start")
    _, state = nnx.split(model)
    flat = dict(nnx.to_flat_state(state))

    def get(key) -> np.ndarray:  # one layer of a scan_layers block, not the block
        stored, r = stored_at(cfg, key)
        value = flat[stored].get_value()
        return np.asarray(distributed.host_copy(value if r is None else value[r]))

    def part(n: int) -> str:  # renamed once the number of shards is known
        return f"part-{n:05d}.safetensors.tmp"

    # a shard is written on a thread while the next one's tensors are converted (numpy and
    # safetensors release the GIL): at most two shards in memory
    writer, pending = concurrent.futures.ThreadPoolExecutor(1, "export_hf"), None

    def save(tensors: dict, name: str) -> None:
        nonlocal pending
        if pending is not None:
            pending.result()
        pending = writer.submit(save_file, tensors, str(path / name), metadata={"format": "pt"})

    shards, current, size, stored_dtype = [[]], {}, 0, None
    for key, value in _hf_tensors(cfg, get):
        value = np.ascontiguousarray(value if dtype is None else value.astype(jnp.dtype(dtype)))
        stored_dtype = stored_dtype or str(value.dtype)
        if hub_layout and key.startswith("model."):
            key = "model.language_model." + key[len("model."):]
        if shards[-1] and size + value.nbytes > max_shard_bytes:
            if (len(shards) - 1) % processes == me:
                save(current, part(len(shards) - 1))
            shards.append([])
            current, size = {}, 0
        shards[-1].append((key, value.nbytes))
        size += value.nbytes
        if (len(shards) - 1) % processes == me:  # the others only count its bytes
            current[key] = value
    if (len(shards) - 1) % processes == me:
        save(current, part(len(shards) - 1))
    if pending is not None:
        pending.result()
    writer.shutdown()
    del current
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{n:05d}-of-{len(shards):05d}.safetensors" for n in range(1, len(shards) + 1)])
    for n, name in enumerate(names):
        if n % processes == me:
            (path / part(n)).replace(path / name)
    distributed.rendezvous("export_hf/written")
    if me == 0:
        if len(shards) > 1:
            weight_map = {key: name for name, shard in zip(names, shards) for key, _ in shard}
            total = sum(nbytes for shard in shards for _, nbytes in shard)
            (path / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        (path / "config.json").write_text(json.dumps(_hf_config(cfg, stored_dtype, hub_layout),
                                                     indent=2))
    distributed.rendezvous("export_hf/done")
    return path


def _hf_config(cfg: ModelConfig, stored: str, hub_layout: bool) -> dict:
    hf_config = cfg.to_hf_dict()
    hf_config["dtype"] = hf_config["torch_dtype"] = stored  # transformers 5 reads `dtype` first
    if hub_layout:
        text = {k: v for k, v in hf_config.items() if k != "architectures"}
        hf_config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                     "model_type": "qwen3_5_moe", "text_config": text,
                     "tie_word_embeddings": cfg.tie_word_embeddings,
                     "dtype": stored, "torch_dtype": stored}
    return hf_config


def _hf_tensors(cfg: ModelConfig, get):
    """(HF key, tensor) of every tensor of the checkpoint, layer by layer, each computed when
    it is reached (`get(our key)` -> that parameter, one layer of it)."""
    seen = set()
    for key, (hf_keys, _) in param_map(cfg, "lm").items():
        if hf_keys[0] in seen:  # a fused tensor, made from several of our parameters
            continue
        fused = _fused(cfg, hf_keys[0], get)
        if fused is not None:
            seen.add(hf_keys[0])
            yield hf_keys[0], fused
            continue
        yield from zip(hf_keys, _from_ours(get(key), hf_keys, cfg))


def _fused(cfg: ModelConfig, name: str, get) -> np.ndarray | None:
    """Qwen3.5's fused HF tensor `name`, built from several of our parameters; None for a
    tensor that is not fused."""
    if not cfg.hybrid or not name.startswith("model.layers."):
        return None
    i = int(name.split(".")[2])
    ours = ("model", "layers", i, "attn")
    if name.endswith(("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight")):
        conv = name.endswith("conv1d.weight")
        parts = [get(ours + ((f"conv_{n}",) if conv else (n,))) for n in ("q", "k", "v")]
        joined = np.concatenate([w.reshape(w.shape[0], -1).T for w in parts])
        return joined[:, None, :] if conv else joined
    if name.endswith("self_attn.q_proj.weight"):
        q, gate = get(ours + ("q",)), get(ours + ("gate",))  # [d, heads, head_dim]
        both = np.stack([q, gate], axis=2)  # [d, heads, 2, head_dim]
        return both.reshape(both.shape[0], -1).T
    return None


def _transposed(m: np.ndarray, rows: int = 16) -> np.ndarray:
    """m.T as a contiguous copy, `rows` input rows at a time, as unsigned integers of the
    same width: numpy's one-pass transposed copy strides through memory, and bf16 is not a
    native type; 2.4x faster here (BENCHMARKS.md, "Weight publish")."""
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(m.dtype.itemsize)
    src = m.view(bits) if bits is not None and m.flags.c_contiguous else m
    out = np.empty(m.shape[::-1], src.dtype)
    for i in range(0, m.shape[0], rows):
        out[:, i:i + rows] = src[i:i + rows].T
    return out.view(m.dtype)


def _from_ours(ours: np.ndarray, hf_keys: list[str], cfg: ModelConfig) -> list[np.ndarray]:
    """The inverse of each (unfused) conversion in `param_map`."""
    name = hf_keys[0]
    if ".experts." in name:
        return [_transposed(ours[e]) for e in range(ours.shape[0])]
    if name.endswith("in_proj_z.weight"):
        return [_transposed(ours.reshape(ours.shape[0], -1))]
    if name.endswith("out_proj.weight"):
        return [_transposed(ours.reshape(-1, ours.shape[-1]))]
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return [_transposed(ours.reshape(ours.shape[0], -1))]
    if name.endswith("o_proj.weight"):
        return [_transposed(ours.reshape(-1, ours.shape[-1]))]
    if name.endswith(("_proj.bias",)):
        return [ours.reshape(-1)]
    if ours.ndim == 2 and not name.endswith("embed_tokens.weight"):
        return [_transposed(ours)]
    return [ours]


def num_params(model: nnx.Module) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

