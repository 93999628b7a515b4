"""The text round-trip a TITO-less harness does: re-render the chat as text, re-encode it, and
attach the sampled log-probs and routes to the re-encoded assistant spans by position.

Why: this is the T1 report's "without TITO" baseline (most RL frameworks): the conversation is
kept as text messages, so every prompt, and the sample trained on, holds the tokenizer's
canonical merges of earlier assistant turns rather than the ids the model sampled. Having lost
which re-encoded token a sampled log-prob belongs to, such a framework pairs them by position.
This is an imitation for ablations, not a repair (tito.repair_boundary is the repair), and it
counts the loss-region tokens that no longer match what was sampled.

Encoding: the whole text is encoded in one pass with special tokens recognised (a sampled
`<tool_call>` is the special id again), except each tool-output body, which is encoded plain so
a command cannot inject `<|im_end|>`. A body always sits between `<tool_response>` and
`</tool_response>`, where the tokenizer splits anyway, so encoding it apart changes no other id.
Spans are located by the tokenizer's character offsets: a turn's span is every token whose
offsets overlap its decoded text (a token merged across the header and the text belongs to the
turn; a tokenizer whose post-processor trims offsets could drop a whitespace-only edge token).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np
from tokenizers import Tokenizer

from t1jax.rollout.chat import ASSISTANT_HEADER, IM_END, IM_START, RESP_CLOSE, RESP_OPEN
from t1jax.rollout.engine import GenerateResult
from t1jax.rollout.tito import encode_plain

TEMPLATE, TOOL_OUTPUT = -1, -2  # segment kinds; an assistant turn's text is tagged by its index


class TextRoundTrip:
    """One episode kept as text; every engine prompt is the whole conversation re-encoded."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.im_end_id = tokenizer.token_to_id(IM_END)
        if self.im_end_id is None:
            raise ValueError(f"tokenizer has no {IM_END} token")
        self.segments: list[tuple[str, int]] = []  # (text, TEMPLATE | TOOL_OUTPUT | turn)
        self.completions: list[list[int]] = []  # the sampled ids of each turn
        self.sampled_logprobs: list[list[float]] = []
        self.sampled_routes: list[np.ndarray] = []  # [sampled, layers, k] per turn
        self.tokens: list[int] = []  # set by finish()
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.spans: list[tuple[int, int]] = []  # each turn's [start, end) in tokens
        self.retokenized_drift = 0
        self._last_fed = -1  # where the previous turn's last sampled id sat in the engine's ids

    def start(self, prefix_text: str) -> None:
        """Begin with the rendered prefix (system + instruction + assistant header)."""
        self.segments = [(prefix_text, TEMPLATE)]

    def add_result(self, prompt_len: int, res: GenerateResult) -> None:
        """Keep the turn as decoded text, with its sampled ids, log-probs and routes.

        Routes of the k-th sampled id: the row its call fed it through; the last id is never fed
        by its own call, so it takes whatever the next call ran at that position (by position,
        as a framework stitching per-call routes would; right when nothing was re-encoded).
        """
        ids = [int(t) for t in res.output_ids]
        if len(ids) != len(res.output_logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(res.output_logprobs)} logprobs")
        rows = np.asarray(res.routed_experts, np.int32)
        if 0 <= self._last_fed < len(rows):
            self.sampled_routes[-1][-1] = rows[self._last_fed]
        mine = np.full((len(ids),) + rows.shape[1:], -1, np.int32)
        mine[:len(rows) - prompt_len] = rows[prompt_len:]
        self._last_fed = prompt_len + len(ids) - 1 if ids else -1
        self.completions.append(ids)
        self.sampled_logprobs.append([float(x) for x in res.output_logprobs])
        self.sampled_routes.append(mine)
        self.segments.append((self.tok.decode(ids, skip_special_tokens=False),
                              len(self.completions) - 1))
        if not ids or ids[-1] != self.im_end_id:  # cut: the template closes the turn
            self.segments.append((IM_END, TEMPLATE))

    def add_observation(self, text: str | list[str]) -> None:
        """Tool results plus the next assistant header: chat.render_observation, as segments."""
        self.segments.append((f"\n{IM_START}user", TEMPLATE))
        for obs in [text] if isinstance(text, str) else text:
            self.segments += [(f"\n{RESP_OPEN}", TEMPLATE), (f"\n{obs}\n", TOOL_OUTPUT),
                              (RESP_CLOSE, TEMPLATE)]
        self.segments.append((f"{IM_END}\n{ASSISTANT_HEADER}", TEMPLATE))

    def _encode(self) -> tuple[list[int], list[tuple[int, int]]]:
        """The conversation's ids and each turn's [start, end) among them."""
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        run: list[tuple[str, int]] = []

        def flush():
            text = "".join(t for t, _ in run)
            enc = self.tok.encode(text, add_special_tokens=False)
            starts = [s for s, _ in enc.offsets]
            ends = [e for _, e in enc.offsets]
            pos = 0
            for piece, kind in run:
                if kind >= 0:  # tokens overlapping [pos, pos + len(piece))
                    first = bisect_right(ends, pos)
                    last = max(bisect_left(starts, pos + len(piece)), first)
                    spans.append((len(ids) + first, len(ids) + last))
                pos += len(piece)
            ids.extend(enc.ids)
            run.clear()

        for piece, kind in self.segments:
            if kind == TOOL_OUTPUT:
                flush()
                ids.extend(encode_plain(self.tok, piece))
            else:
                run.append((piece, kind))
        flush()
        return ids, spans

    def prompt_for_next_turn(self) -> list[int]:
        """The whole conversation so far, rendered as text and encoded again."""
        return self._encode()[0]

    def finish(self) -> list[int]:
        """Encode the final conversation; each turn's span gets its sampled log-probs by position
        (cut or padded with 0.0) and the mask; count the span tokens that are not the sampled
        ids at that position, plus the length difference, as retokenized_drift."""
        self.tokens, self.spans = self._encode()
        n = len(self.tokens)
        self.loss_mask, self.logprobs, self.retokenized_drift = [0] * n, [0.0] * n, 0
        for (s, e), sampled, lps in zip(self.spans, self.completions, self.sampled_logprobs):
            m = e - s
            self.loss_mask[s:e] = [1] * m
            self.logprobs[s:e] = (lps + [0.0] * m)[:m]
            self.retokenized_drift += sum(a != b for a, b in zip(self.tokens[s:e], sampled)) \
                + abs(m - len(sampled))
        return self.tokens

    def place_routes(self, prompt_routes: np.ndarray) -> np.ndarray:
        """prompt_routes (the engine's rows by position, [len(tokens), layers, k]: the agent
        passes each position's row from the first call that ran it, misaligned wherever the
        re-encoding shifted the text) with each turn's span replaced by its sampled ids' routes
        by position (cut or padded with -1)."""
        out = np.array(prompt_routes, np.int32)
        for (s, e), rows in zip(self.spans, self.sampled_routes):
            k = min(e - s, len(rows))
            out[s:e] = -1
            out[s:s + k] = rows[:k]
        return out
