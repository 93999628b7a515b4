"""Rollout: the engine contract and its engines, the agent harnesses, TITO, the rollout
scheduler, Samples on disk, how a trial runs, and evaluation.

agent.py: the multi-turn tool-call agent loop, which keeps the ids, log-probs and expert routes
  the engine sampled (TITO), as RL trains on exactly those.
batching.py: merges concurrent generate calls into batched ones, so trials sharing one embedded
  engine decode together.
chat.py: the pinned Qwen-style chat template with one `bash` tool as exact strings, so a template
  change elsewhere cannot shift the token boundaries trained on.
context.py: episodes longer than one context window (stop, elide or summary), each compaction
  starting a new chunk of the same trial.
engine.py: the contract every generator meets, with SGLang's semantics: ids plus sampled
  log-probs, expert routes and the weight version.
eval_summary.py: an evaluation's numbers from its trials.jsonl rows (pass@k, failure modes,
  summary, Markdown), with no sandbox or engine.
evaluate.py: evaluates a policy on a Harbor / Terminal-Bench directory the way T1 reports it,
  and writes trials, summary and samples.
fan_out.py: sandbox work over many tasks written once (images built once, a bounded pool,
  build failures named alike, the run's sandboxes reaped), for every caller.
harness.py: the turn loop and episode rules both agent harnesses share, so both end episodes
  for the same reasons.
jax_engine.py: the embedded batched, KV-cached generator for `CausalLM` (continuous batching,
  prefix reuse per session), for runs without an inference server.
oracle_data.py: each task's reference solution replayed through the real agent loop and
  verifier, as SFT data for the warm start.
retokenize.py: the text round trip of a TITO-less harness, the "without TITO" baseline for
  ablations.
sample.py: `Sample`, a finished, verified rollout as the trainer consumes it, its .npz form and
  sets on disk: where rollouts and training meet.
scheduler.py: oversampled rollout steps whose unfinished trials carry over to the next step
  rather than being dropped.
settings.py: `EpisodeSettings`, how one episode plays and is verified, built once from a config
  and handed down whole to training rollouts, evaluations and the oracle's SFT episodes.
server.py: a JaxEngine behind SGLang's native HTTP API, so the fleet client and the trainer
  treat it and SGLang alike.
sglang.py: a client for a fleet of SGLang-API servers returning `GenerateResult`s; a failed
  request is retried whole on another server.
sglang_protocol.py: SGLang's /generate wire format (request checks, reply shape) as pure
  functions of JSON values, for server.py.
source.py: the training loop's live rollout source: sampled tasks become trial requests, their
  samples go to training, each new policy to the engine.
terminus.py: Terminus-2 style JSON replies mapped onto the persistent-shell sandbox, to train
  and evaluate in the format T1 evaluates with.
terminus_agent.py: a Terminus-2 style episode as a text round trip joined to the sampled ids by
  repair, to measure how far a text harness drifts from TITO.
tito.py: token-in, token-out trajectories: sampled ids kept verbatim, glue encoded once per turn,
  `audit` to prove it and `repair_boundary` for text harnesses.
tokenizer.py: a small byte-level BPE tokenizer trained locally, so TITO bugs show up with real
  merges and tests need no downloads.
trial.py: `run_trial`, the one way every caller starts a task's sandbox, plays, verifies and
  closes it, at a `TrialSite` (where a job's trials run, handed down whole).
"""
