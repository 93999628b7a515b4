"""Token-in, token-out trajectories: sampled ids are the record, glue is encoded once per turn.

Why: re-rendering a conversation as text and re-encoding it picks canonical BPE merges, which
need not be the ids the model sampled, so the tokens trained on drift from the tokens whose
logprobs were sampled. Here the sampled ids are appended verbatim (loss mask 1), only the template
glue and observations are encoded (mask 0), and `audit` proves every completion sits unchanged in
the next prompt. `repair_boundary` is the fallback for harnesses that can only re-render text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tokenizers import Tokenizer

from t1jax.rollout.chat import ASSISTANT_HEADER, IM_END, IM_START, RESP_CLOSE, RESP_OPEN

REPAIR_CASES = ("strict", "normalized", "retokenized", "split")


def encode_plain(tok: Tokenizer, text: str) -> list[int]:
    """Encode text in which special-token strings are ordinary text (tool output cannot inject
    `<|im_end|>`)."""
    old = tok.encode_special_tokens
    tok.encode_special_tokens = True
    try:
        return tok.encode(text, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = old


def assistant_header_ids(tok: Tokenizer) -> list[int]:
    """Ids of `<|im_start|>assistant\n`, with which every prompt and observation ends: a reply's
    sampled ids always follow them (the loss-mask check reads this)."""
    return tok.encode(ASSISTANT_HEADER, add_special_tokens=False).ids


def encode_observation(tok: Tokenizer, observations: list[str], note: str = "") -> list[int]:
    """Ids of `chat.render_observation(observations, note)`: template with specials, bodies
    (and the harness's note after them, if any) plain."""
    def special(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    ids = special(f"\n{IM_START}user")
    for obs in observations:
        ids += special("\n" + RESP_OPEN)  # after "user" or the previous response
        ids += encode_plain(tok, f"\n{obs}\n")
        ids += special(RESP_CLOSE)
    if note:
        ids += encode_plain(tok, "\n" + note)
    return ids + special(f"{IM_END}\n") + assistant_header_ids(tok)


class TrajectoryBuilder:
    """One episode's token sequence with its loss mask and sampling logprobs."""

    def __init__(self, tokenizer: Tokenizer, im_end_id: int | None = None):
        self.tok = tokenizer
        self.im_end_id = im_end_id if im_end_id is not None else tokenizer.token_to_id(IM_END)
        if self.im_end_id is None:
            raise ValueError(f"tokenizer has no {IM_END} token")
        self.tokens: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.completion_offsets: list[int] = []
        self.completions: list[list[int]] = []
        self.cut_turns = 0  # turns closed by the glue because the sampler hit max tokens

    def start(self, prompt_ids: list[int]) -> None:
        """Begin with the rendered prefix's ids (system + instruction + assistant header)."""
        self.tokens = [int(t) for t in prompt_ids]
        self.loss_mask = [0] * len(self.tokens)
        self.logprobs = [0.0] * len(self.tokens)
        self.completion_offsets, self.completions, self.cut_turns = [], [], 0

    def _append(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.tokens += ids
        self.loss_mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def add_completion(self, sampled_ids: list[int], logprobs: list[float],
                       finish_reason: str = "stop") -> None:
        """Append the sampled ids verbatim (mask 1); close a turn the sampler left open."""
        if len(sampled_ids) != len(logprobs):
            raise ValueError(f"{len(sampled_ids)} sampled ids but {len(logprobs)} logprobs")
        ids = [int(t) for t in sampled_ids]
        self.completion_offsets.append(len(self.tokens))
        self.completions.append(ids)
        self._append(ids, 1, [float(x) for x in logprobs])
        if not ids or ids[-1] != self.im_end_id:
            # Cut on max tokens (or a stop string): the glue closes the turn, untrained.
            self.cut_turns += finish_reason == "length"
            self._append([self.im_end_id], 0)

    def add_observation(self, text: str | list[str], note: str = "") -> None:
        """Append tool results (and a note from the harness) plus the next assistant header,
        encoded once, mask 0."""
        self._append(encode_observation(self.tok, [text] if isinstance(text, str) else text,
                                        note), 0)

    def prompt_for_next_turn(self) -> list[int]:
        """Everything so far: the next engine prompt is exactly this, never a re-render."""
        return list(self.tokens)


@dataclass
class AuditReport:
    drift_tokens_in_loss_region: int = 0
    relocated: list[int] = field(default_factory=list)  # where each completion was found; -1: not
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.drift_tokens_in_loss_region == 0 and not self.errors


def _find(hay: list[int], needle: list[int], start: int = 0) -> int:
    """First offset >= start where needle occurs in hay, or -1."""
    n = len(needle)
    for i in range(start, len(hay) - n + 1):
        if hay[i:i + n] == needle:
            return i
    return -1


def audit(builder, engine_prompts: list[list[int]], completions: list[list[int]]) -> AuditReport:
    """Re-locate every completion in the next prompt (or the final sequence) and count drift.

    Completion i is expected at len(engine_prompts[i]) in engine_prompts[i + 1], or in
    builder.tokens for the last one; a loss-region token that differs there counts as drift.
    """
    rep = AuditReport()
    if len(engine_prompts) != len(completions):
        rep.errors.append(f"{len(engine_prompts)} prompts but {len(completions)} completions")
    final = list(builder.tokens)
    offsets = getattr(builder, "completion_offsets", None)
    for i, (prompt, comp) in enumerate(zip(engine_prompts, completions)):
        off = len(prompt)
        if offsets is not None and i < len(offsets) and offsets[i] != off:
            rep.errors.append(f"turn {i}: builder offset {offsets[i]} != prompt length {off}")
        target = list(engine_prompts[i + 1]) if i + 1 < len(engine_prompts) else final
        if target[:off] != list(prompt):
            rep.errors.append(f"turn {i}: next sequence does not extend this prompt")
        window = target[off:off + len(comp)]
        drift = sum(a != b for a, b in zip(window, comp)) + len(comp) - len(window)
        rep.drift_tokens_in_loss_region += drift
        rep.relocated.append(off if drift == 0 else _find(target, list(comp)))
        if drift:
            rep.errors.append(f"turn {i}: {drift} loss-region tokens drifted at offset {off}")
    return rep


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: visible char -> the byte it stands for."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTES = _byte_decoder()


def token_bytes(tok: Tokenizer, ids: list[int]) -> list[bytes]:
    """Exact bytes of each token (decoding ids one at a time would mangle split UTF-8)."""
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
    out = []
    for i in ids:
        if i in added:
            out.append(added[i].encode())
        else:
            piece = tok.id_to_token(i)
            if piece is None:
                raise ValueError(f"id {i} is not in the vocabulary")
            out.append(bytes(_BYTES[c] for c in piece))
    return out


def repair_boundary(prev_tokens: list[int], new_prompt_ids: list[int], completion_ids: list[int],
                    tokenizer: Tokenizer, max_trim: int = 2,
                    counters: Counter | None = None) -> tuple[str, list[int]]:
    """Join a re-rendered, re-encoded prompt onto the ids we already hold.

    prev_tokens: the sequence so far (last prompt + completion_ids). Cases, tried in order:
    strict (new prompt extends prev_tokens), normalized (it does after trimming <= max_trim
    tokens off the end, never past the completion's start: trailing whitespace or `<|im_end|>`
    the template re-rendered; those few edge tokens come from the new render), retokenized (the
    bytes match at a token boundary; prev_tokens are kept, so the sampled ids stay what is
    trained), split (no match: the caller starts a new chunk from new_prompt_ids).
    """
    prev, new = list(prev_tokens), list(new_prompt_ids)
    case, ids = "split", new
    comp_start = len(prev) - len(completion_ids)
    if new[:len(prev)] == prev:
        case, ids = "strict", new
    else:
        for k in range(1, max_trim + 1):
            keep = len(prev) - k
            if keep >= comp_start and keep >= 0 and new[:keep] == prev[:keep]:
                case, ids = "normalized", new
                break
        else:
            want = b"".join(token_bytes(tokenizer, prev))
            got, pos = token_bytes(tokenizer, new), 0
            for j, piece in enumerate(got):
                pos += len(piece)
                if pos >= len(want):
                    if pos == len(want) and b"".join(got[:j + 1]) == want:
                        case, ids = "retokenized", prev + new[j + 1:]
                    break
    if counters is not None:
        counters[case] += 1
    return case, ids
