"""Route bytes on the wire and client decode seconds per trial, by turns: every position's routes
resent each turn (before: no routed_experts_start_len) against only the new positions' (after).

A trial is synthetic (no model): it starts from a --prompt-token prompt and each turn adds
--turn-tokens (the reply and the tool output). Each turn's /generate reply is built as SGLang
writes it (output ids, log-probs, base64 int32 routes [rows, layers, k]) at the route shape of
a run config (default: configs/t1_qwen35_122b.py, Qwen3.5-122B-A10B) and parsed by FleetClient
exactly as a live trial's (JSON, base64, the route checks), then stitched by the agent's
RouteRecord. Bytes are the reply bodies; seconds the client's parse and stitch. Both arms run
in the same process on the same replies' shapes; the ratio is before / after.

  .venv/bin/python experiments/benchmarks/incremental_routes.py \
      [--turns 8,16,32,64] [--prompt-tokens 2000] [--turn-tokens 680]
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import time


import numpy as np  # noqa: E402

from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.rollout.engine import SamplingParams  # noqa: E402
from t1jax.rollout.harness import RouteRecord  # noqa: E402
from t1jax.rollout.sglang import FleetClient, RouteLayout  # noqa: E402

OUTPUT_TOKENS = 200  # of each turn's tokens, the reply's; the rest is the tool output


def reply(rows: np.ndarray, output_ids: list[int]) -> bytes:
    """A /generate reply body as SGLang sends it."""
    return json.dumps({"output_ids": output_ids, "meta_info": {
        "output_token_logprobs": [[-0.5, t, None] for t in output_ids],
        "finish_reason": {"type": "stop"}, "completion_tokens": len(output_ids),
        "routed_experts": base64.b64encode(rows.astype("<i4").tobytes()).decode(),
        "weight_version": "0"}}).encode()


def trial(client: FleetClient, layout: RouteLayout, turns: int, prompt_tokens: int,
          turn_tokens: int, incremental: bool, rng) -> tuple[int, float]:
    """(reply bytes, parse + stitch seconds) of one trial."""
    moe = [i for i in range(layout.layers) if i not in layout.dense_layers]
    tokens = list(rng.integers(0, 1000, prompt_tokens))
    record, sent, seconds = RouteRecord(), 0, 0.0
    # the trial's routes, one row per position: k distinct experts on every MoE layer
    all_rows = np.full((prompt_tokens + turns * turn_tokens, layout.layers, layout.k), -1,
                       np.int32)
    first = rng.integers(0, layout.num_experts, (len(all_rows), len(moe), 1))
    all_rows[:, moe] = (first + np.arange(layout.k)) % layout.num_experts
    for _ in range(turns):
        out = [int(t) for t in rng.integers(0, 1000, OUTPUT_TOKENS)]
        start = record.routes_from(tokens) if incremental else 0
        sampling = SamplingParams(max_new_tokens=OUTPUT_TOKENS, routes_from=start)
        body = reply(all_rows[start:len(tokens) + len(out) - 1], out)
        sent += len(body)
        t0 = time.perf_counter()
        res = client._parse("bench", tokens, sampling, json.loads(body))
        record.add(tokens, res)
        seconds += time.perf_counter() - t0
        tokens += out + [int(t) for t in rng.integers(0, 1000, turn_tokens - OUTPUT_TOKENS)]
    assert np.array_equal(record.rows, all_rows[:len(record.rows)])
    return sent, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/t1_qwen35_122b.py")
    ap.add_argument("--turns", default="8,16,32,64")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--turn-tokens", type=int, default=680)
    args = ap.parse_args()
    cfg = model_config_from(load_config_file(args.config).model)
    layout = RouteLayout.of(cfg)
    client = FleetClient(["http://127.0.0.1:1"], layout)  # parses replies; never connects
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.machine())
    print(f"{cpu}, {args.config}: routes "
          f"[{layout.layers} layers, k={layout.k}] of {layout.num_experts} experts, "
          f"{layout.layers * layout.k * 4} bytes per position before base64; prompt "
          f"{args.prompt_tokens} tokens, {args.turn_tokens} per turn")
    print("| turns | trial tokens | before: MB | before: decode s | after: MB | after: decode s "
          "| bytes ratio | decode ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for turns in [int(t) for t in args.turns.split(",")]:
        rng = np.random.default_rng(turns)
        before = trial(client, layout, turns, args.prompt_tokens, args.turn_tokens, False, rng)
        rng = np.random.default_rng(turns)
        after = trial(client, layout, turns, args.prompt_tokens, args.turn_tokens, True, rng)
        print(f"| {turns} | {args.prompt_tokens + turns * args.turn_tokens} | "
              f"{before[0] / 1e6:.0f} | {before[1]:.2f} | {after[0] / 1e6:.1f} | {after[1]:.2f} "
              f"| {before[0] / after[0]:.1f}x | {before[1] / after[1]:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
