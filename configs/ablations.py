"""Single-axis ablations of the tiny recipe: configs/tiny_cpu.py with exactly one thing changed.

  python experiments/run.py --config configs/ablations.py:no_r3 --workdir runs/abl_no_r3 \
      --config.reuse=runs/tiny_cpu

Variants (the argument after the colon):
  no_r3          the actor's training forward routes on its own (rl.r3=False) instead of
                 replaying the rollout's expert selection
  binary_reward  PPO optimises the solved/unsolved outcome instead of T1's dense reward
                 (rl.reward=binary); every other axis matched (pool, SFT actor, critic, seeds)
  shuffled_reward
                 a control, not a method: each step's dense rewards permuted over its trials
                 (rl.reward=shuffled), so the updates are as large but carry no information; a
                 held-out fall as large as the main run's is optimizer drift
  zero_reward    a control: every trial's reward is 0 (rl.reward=zero), so PPO's updates
                 follow only the warm critic's baseline; together with shuffled_reward it
                 bounds what the main run's gain could be without a signal
  cold_critic    no Critic Warm-Up: PPO starts from a critic whose backbone is the SFT actor and
                 whose value head is fresh (warmup.steps=0); the head starts at zero, so
                 its values start at 0 everywhere
  cold_critic_random_head
                 cold_critic with the head PyTorch's nn.Linear starts with (U(+-1/sqrt(d)),
                 rl.value_head_init=uniform): per-token noise on the returns' scale, the cold
                 start the T1 report describes
  one_step_off   rollouts of step t+1 run during training of step t (T1's pipeline); the
                 default tiny run is synchronous
  sync           the synchronous schedule, spelled out (the tiny_cpu default)
  no_tito        no token-in/token-out (rollouts.tito=False): every turn re-renders the chat as
                 text and re-encodes it, so prompts and the trained sample hold canonical BPE
                 ids instead of the sampled ones, with sampled log-probs and routes attached by
                 position (what a text-only harness does; see t1jax/rollout/retokenize.py);
                 rollout/retokenized_drift counts the loss-region ids that no longer match.
                 Re-encoding can make a finished trial longer than the budget its rollout kept
                 to (never with TITO, whose budget counts the very ids trained on), so this
                 variant also drops overlong samples (rl.overlong=drop, counted in
                 batch/dropped_overlong) instead of stopping the run

--config.reuse=WORKDIR links the phases the ablation does not change (pool, tokenizer, oracle,
SFT, Critic Warm-Up, base/SFT evaluations) from a finished main run, so only PPO and its
evaluation run again (~10 minutes on 2 cores instead of ~40).
"""

import ml_collections

from configs import tiny_cpu

VARIANTS = {
    "no_r3": lambda c: setattr(c.rl, "r3", False),
    "binary_reward": lambda c: setattr(c.rl, "reward", "binary"),
    "shuffled_reward": lambda c: setattr(c.rl, "reward", "shuffled"),
    "zero_reward": lambda c: setattr(c.rl, "reward", "zero"),
    "cold_critic": lambda c: setattr(c.warmup, "steps", 0),
    "cold_critic_random_head": lambda c: (setattr(c.warmup, "steps", 0),
                                          setattr(c.rl, "value_head_init", "uniform")),
    "one_step_off": lambda c: setattr(c, "schedule", "one_step_off"),
    "sync": lambda c: setattr(c, "schedule", "sync"),
    "no_tito": lambda c: (setattr(c.rollouts, "tito", False), setattr(c.rl, "overlong", "drop")),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in VARIANTS:
        raise ValueError(f"configs/ablations.py needs a variant, e.g. configs/ablations.py:no_r3; "
                         f"got {arg!r}; variants: {sorted(VARIANTS)}")
    config = tiny_cpu.get_config()
    VARIANTS[arg](config)
    config.ablation = arg
    return config
