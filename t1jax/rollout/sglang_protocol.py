"""SGLang's native /generate wire format, as our server speaks it: a request body checked and
read into prompts and SamplingParams (anything we cannot honour refused with a 400 naming the
field), and a GenerateResult written back as SGLang's reply (meta_info, finish reasons, output
log-probs, base64 routed experts; an aborted request as FINISH_ABORT). Versions and SGLang's
source lines for each rule are in t1jax/rollout/server.py's docstring.

Separate from server.py, which runs the engine and the HTTP handler: these are pure functions
of JSON values, checked against SGLang's own contract (tests/rollout/test_sglang_contract.py) without
a model or a socket.
"""

from __future__ import annotations

import base64
import uuid

import numpy as np

from t1jax.rollout.engine import FINISH_STOP, GenerateResult, SamplingParams


class BadRequest(ValueError):
    """A client error (HTTP 400) naming the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


_SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int, "max_new_tokens": int}
# accepted and honoured as SGLang does; with no text output, the text-shaping ones change nothing
_SAMPLING_FLAGS = ("ignore_eos", "no_stop_trim", "skip_special_tokens",
                   "spaces_between_special_tokens")
# GenerateReqInput fields that only change what a served request returns or logs, accepted
# off and refused by name on; the ones sglang-router (smg) 1.13 fills in on every request it
# forwards are among them, and return_hidden_states, which sglang-router 0.3.2 adds
_OFF_ONLY = ("stream", "return_text_in_logprobs", "background", "return_bytes", "return_entropy",
             "return_hidden_states")
# SGLang 0.5.23's other GenerateRequest fields (sglang/api/v1/api_types.py): what this engine
# does not do (text input, images, LoRA, sessions, disaggregation, priorities, cache salts,
# reasoning budgets, custom logit processors), accepted unset (SGLang's defaults: null, or these
# values) and refused by name when set
_UNSET_ONLY = {name: (None,) for name in (
    "text", "token_ids_logprob", "bootstrap_host", "bootstrap_port", "bootstrap_room",
    "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank", "disagg_prefill_dp_rank",
    "image_data", "mm_hashes", "video_data", "audio_data", "extra_key", "priority",
    "cache_salt", "lora_path", "session_params", "kv_hints", "max_thinking_tokens",
    "session_id", "custom_logit_processor", "images_config")}
_UNSET_ONLY.update({"require_reasoning": (None, False), "custom_labels": (None, {}),
                    "return_prompt_token_ids": (None, False), "return_sampling_mask": (None, False),
                    "modalities": (None, [])})
_BODY_KEYS = {"input_ids", "sampling_params", "return_logprob", "return_routed_experts", "rid",
              "routing_key", "logprob_start_len", "routed_experts_start_len", "top_logprobs_num",
              "model", "log_metrics", "no_logs", *_OFF_ONLY, *_UNSET_ONLY}


# SGLang sampling keys this engine does not implement, accepted at the value that changes
# nothing (SGLang 0.5.23's defaults, sglang/api/v1/api_types.py SamplingParams) and refused by
# name at any other
_NOOP_SAMPLING = {"min_p": (0, 0.0), "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0),
                  "repetition_penalty": (1, 1.0), "min_new_tokens": (0,), "logit_bias": ({},),
                  "stop_regex": (None, "", []), "json_schema": (None,), "regex": (None,),
                  "ebnf": (None,), "structural_tag": (None,), "custom_params": (None,),
                  "stream_interval": (None,), "beam_width": (None,), "watermark": (None,),
                  "choice": ([],)}


def parse_sampling(d, field: str = "sampling_params",
                   eos_ids: tuple[int, ...] = ()) -> SamplingParams:
    """SGLang's sampling_params dict -> SamplingParams; unknown keys are rejected (a typo would
    otherwise silently sample with defaults). eos_ids (the model's) stop a sample unless
    ignore_eos, which, as in SGLang, also disables stop_token_ids."""
    if not isinstance(d, dict):
        raise BadRequest(field, "must be an object")
    known = set(_SAMPLING_KEYS) | {"stop_token_ids", "sampling_seed", "stop", "n",
                                   *_SAMPLING_FLAGS}
    for k in d:
        if k in _NOOP_SAMPLING:
            if not any(d[k] == v and type(d[k]) is type(v) or d[k] is v
                       for v in _NOOP_SAMPLING[k]):
                raise BadRequest(f"{field}.{k}", f"not implemented by this engine; only "
                                 f"{_NOOP_SAMPLING[k][-1]!r} (no effect) is served")
        elif k not in known:
            raise BadRequest(f"{field}.{k}", f"unsupported; supported: {sorted(known)}")
    for k in _SAMPLING_FLAGS:
        if not isinstance(d.get(k, False), bool):
            raise BadRequest(f"{field}.{k}", "must be a boolean")
    if d.get("stop") not in (None, "", []):
        raise BadRequest(f"{field}.stop", "stop strings need a tokenizer, which this server "
                         "does not load; send stop_token_ids")
    if d.get("n", 1) != 1 or isinstance(d.get("n"), bool):
        raise BadRequest(f"{field}.n", "only n=1 is served; send the prompt n times")
    kw = {}
    for k, typ in _SAMPLING_KEYS.items():
        if d.get(k) is not None:
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    (typ is int and v != int(v)):
                raise BadRequest(f"{field}.{k}", f"must be a number{' (integer)' * (typ is int)}")
            kw[k] = typ(v)
    stop = d.get("stop_token_ids") or []
    if not isinstance(stop, list) or not all(_is_int(t) for t in stop):
        raise BadRequest(f"{field}.stop_token_ids", "must be a list of integers")
    kw["stop_token_ids"] = () if d.get("ignore_eos") else tuple(dict.fromkeys([*stop, *eos_ids]))
    if d.get("sampling_seed") is not None:
        if not _is_int(d["sampling_seed"]):
            raise BadRequest(f"{field}.sampling_seed", "must be an integer")
        kw["seed"] = int(d["sampling_seed"])
    try:
        return SamplingParams(**kw)
    except ValueError as err:
        name = str(err).split(" ")[0]
        raise BadRequest(f"{field}.{name}", str(err)) from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_generate(body, vocab_size: int, eos_ids: tuple[int, ...] = ()):
    """(prompts, sampling list, batched?, return_logprob, return_routed_experts, options) from a
    body; options: rids (one per prompt, or None) and routed_experts_start_len."""
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    for k in body:
        if k not in _BODY_KEYS:
            raise BadRequest(k, f"unsupported; supported: {sorted(_BODY_KEYS)}")
    for k in _OFF_ONLY:
        if body.get(k) not in (None, False):
            raise BadRequest(k, "only false is served")
    for k, unset in _UNSET_ONLY.items():
        if k in body and not any(body[k] == v and type(body[k]) is type(v) for v in unset):
            raise BadRequest(k, f"not implemented by this engine; only {unset[-1]!r} (unset) "
                             "is served")
    for k in ("log_metrics", "no_logs"):  # logging switches: nothing to log here
        if not isinstance(body.get(k, False), bool):
            raise BadRequest(k, "must be a boolean")
    if body.get("logprob_start_len") not in (None, -1):
        raise BadRequest("logprob_start_len", "input log-probs are not computed; only -1 "
                         "(output log-probs) is served")
    if body.get("top_logprobs_num", 0) not in (0, None):
        raise BadRequest("top_logprobs_num", "top log-probs are not computed; only 0 is served")
    if body.get("routing_key") is not None and not isinstance(body["routing_key"], str):
        raise BadRequest("routing_key", "must be a string")
    ids = body.get("input_ids")
    if ids is None:
        raise BadRequest("input_ids", "is required (text input is not supported)")
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    prompts = ids if batched else [ids]
    for i, p in enumerate(prompts):
        if not isinstance(p, list) or not p or not all(_is_int(t) for t in p):
            raise BadRequest("input_ids", f"prompt {i} must be a non-empty list of integers")
        if min(p) < 0 or max(p) >= vocab_size:
            raise BadRequest("input_ids", f"prompt {i} has ids outside [0, {vocab_size})")
    sp = body.get("sampling_params") or {}
    if isinstance(sp, list):
        if len(sp) != len(prompts):
            raise BadRequest("sampling_params", f"{len(sp)} entries for {len(prompts)} prompts")
        sampling = [parse_sampling(s, f"sampling_params[{i}]", eos_ids)
                    for i, s in enumerate(sp)]
    else:
        sampling = [parse_sampling(sp, eos_ids=eos_ids)] * len(prompts)
    flags = []
    for k in ("return_logprob", "return_routed_experts"):
        value = body.get(k) or False  # SGLang's default: null
        if not isinstance(value, bool):
            raise BadRequest(k, "must be a boolean")
        flags.append(value)
    rid = body.get("rid")
    if rid is not None:  # SGLang: a string (batched: "<rid>_<i>") or one string per prompt
        rids = [rid] if isinstance(rid, str) and not batched else \
            [f"{rid}_{i}" for i in range(len(prompts))] if isinstance(rid, str) else rid
        if not isinstance(rids, list) or len(rids) != len(prompts) or \
                not all(isinstance(r, str) for r in rids):
            raise BadRequest("rid", "must be a string or one string per prompt")
    else:
        rids = None
    start = body.get("routed_experts_start_len") or 0
    if not _is_int(start) or not all(0 <= start <= len(p) for p in prompts):
        raise BadRequest("routed_experts_start_len", "must be an integer in [0, prompt length]")
    return prompts, sampling, batched, *flags, {"rids": rids, "routed_experts_start_len": start}


def to_response(prompt, res: GenerateResult, logprob: bool, routes: bool, rid: str | None = None,
                routes_start: int = 0) -> dict:
    """One request's SGLang response dict."""
    finish = ({"type": "stop", "matched": res.output_ids[-1]} if res.finish_reason == FINISH_STOP
              else {"type": "length", "length": len(res.output_ids)})
    meta = {"id": rid or uuid.uuid4().hex, "prompt_tokens": len(prompt),
            "completion_tokens": len(res.output_ids), "finish_reason": finish,
            "weight_version": res.weight_version}
    if logprob:
        meta["output_token_logprobs"] = [[float(lp), int(t), None]
                                         for lp, t in zip(res.output_logprobs, res.output_ids)]
    if routes:
        raw = np.ascontiguousarray(res.routed_experts[routes_start:], dtype="<i4").tobytes()
        meta["routed_experts"] = base64.b64encode(raw).decode("ascii")
    return {"text": "", "output_ids": list(res.output_ids), "meta_info": meta}


def aborted_response(prompt, rid) -> dict:
    """SGLang's reply to a request aborted before it ran (FINISH_ABORT.to_json)."""
    return {"text": "", "output_ids": [], "meta_info": {
        "id": rid or uuid.uuid4().hex, "prompt_tokens": len(prompt), "completion_tokens": 0,
        "finish_reason": {"type": "abort", "message": "generation paused (mode=abort)",
                          "status_code": 503, "err_type": None}}}
