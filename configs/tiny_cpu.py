"""The main job: the whole T1 recipe on a laptop (2 CPU cores, embedded engine, local sandboxes).

  python experiments/run.py --config configs/tiny_cpu.py --workdir runs/tiny_cpu

Generates short shell task families (train, validation and test splits; validation and test
hold out entity/family combinations and fresh instances), trains a tokenizer for them,
validates the pool with the oracle, plays the oracle solutions and a slipping teacher's
through the agent loop as SFT data, trains SFT, Critic Warm-Up and PPO (R3, TITO, dense
reward), evaluates base / SFT / PPO on the test split (3 attempts each; SFT and PPO on
validation too), and writes `report/` (plots, summary.md, trajectories.html). Re-run the same command to resume. Run a subset of phases with
--config.phases=pool,oracle,sft (phases: pool, oracle, sft, warmup, ppo, eval, report; and
aot, run only when named: the TPU fit check, config.aot).
README has the phase times and the held-out table of one fresh run (the time depends on the
CPU: 2-core VMs have differed 3.5x at training steps). The same job as several processes (one
per host of a pod, or N on one machine): experiments/launch_local.py, BUILD.md "Accelerators".
"""

import ml_collections

from configs.common import (check_variant, eval_config, rl_config, rollouts_config,
                            sandbox_config, verifier_config)
from configs.model import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    check_variant("tiny_cpu", arg)
    config = ml_collections.ConfigDict()
    config.mode = "recipe"
    config.seed = 0
    config.phases = ""  # comma-separated subset; "" = all, in order
    config.reuse = ""  # a finished run's workdir: link its pool, oracle, SFT, warm-up, base/SFT evals
    config.ablation = ""  # set by configs/ablations.py
    config.schedule = "sync"  # sync | one_step_off

    base = tiny.get_config()
    config.model, config.mesh = base.model, base.mesh

    config.pool = ml_collections.ConfigDict()
    # "": generate the task families below; a folder: an outside pool (the real-scale
    # configs) holding train/, heldout/ (the test split) and optionally validation/, each a
    # folder of task folders, linked into the workdir (needs rollouts.tokenizer)
    config.pool.dir = ""
    # an outside pool's train split is refused if it overlaps heldout/ or validation/
    # (t1jax/tasks/decontam.py); False for held-out splits that are near by design
    config.pool.decontaminate = True
    config.pool.families = ""  # "" = all (t1jax/curation/families.py FAMILIES)
    config.pool.train_per_family = 50  # 300 distinct SFT samples: fewer never learned (docs/probes.md)
    # three disjoint splits: train; validation (settings are chosen on it; PPO's periodic
    # evaluations); test (the held-out tasks, touched only by the final evaluations). Each
    # family holds out 2 key entities for test and 1 other for validation, so the two splits
    # share no held-out (family, key) combination (with 50 train tasks per family, the
    # fixture families cannot spare a fourth key: 4 second slots per key)
    config.pool.heldout_per_family = 8
    config.pool.heldout_keys_per_family = 2
    config.pool.validation_per_family = 4
    config.pool.validation_keys_per_family = 1

    config.oracle = ml_collections.ConfigDict()
    config.oracle.train_per_family = 4  # train tasks per family checked oracle vs do-nothing (-1: all)

    config.rl = rl_config()
    # chosen on the validation split (docs/probes.md, "A teacher that slips"): from the slipping
    # teacher's SFT (5.6%), 3e-4 ended at 13.9% (+8.3 pts, SE 4.1) and 1e-4 at 9.7% (+4.2,
    # SE 2.3); from the perfect teacher's SFT, 1e-4 was best ("PPO's learning rate on the
    # validation split")
    config.rl.actor_lr = 3e-4
    config.rl.critic_lr = 1e-3  # 3e-4: values crawl toward the returns; 3e-3: they oscillate
    config.rl.max_length = 384
    config.rl.min_length = 384

    # rollouts.tokenizer "": trained by the pool phase on the train split's text
    # (model.vocab_size ids); a tokenizer.json (the model's own) is copied into the workdir
    config.rollouts = r = rollouts_config()
    from t1jax.curation.families import SYSTEM_PROMPT
    r.system_prompt = SYSTEM_PROMPT  # short: the tiny model reads it every turn
    r.max_turns = 3
    r.max_new_tokens = 48
    r.weights_dir = ""  # where the fleet's published weights go ("": the workdir)
    r.batch_size = 8  # trials per PPO step
    r.group_size = 1  # trials of each task per step (rl.baseline="task" uses them)
    # 1: every launched trial is trained, so a seeded run repeats (with more, which trials a
    # step admits depends on timing); the real-scale configs oversample to cut the tail
    r.oversample = 1.0
    r.carry_over = True
    # "": Warm-Up and PPO play live; a folder of step_*/ sample folders (what a run records
    # in warmup/rollouts/ and ppo/rollouts/): replayed instead, step t from the t-th (cycling),
    # with no sandbox and no engine (trainer ablations, resume tests)
    r.recorded_dir = ""
    r.sampling_seed = -1  # -1: from config.seed and the stage; >= 0: this, every stage

    config.init = ml_collections.ConfigDict()
    # "": the base policy is config.model at config.seed's random init; a Hugging Face model
    # folder (safetensors + config.json, which config.model must describe): its weights, which
    # SFT starts from and the base evaluation measures
    config.init.hf_path = ""

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every = 1  # Warm-Up and PPO steps between checkpoints (SFT: its own)
    config.checkpoint.keep = 3

    config.sft = ml_collections.ConfigDict()
    # copying the instruction's words forms abruptly, at a step that moves with float-level
    # differences and the data order: 1200 cosine steps ended before it in one run (validation
    # 1.4%) and after it in another (5.6%); 2400 let it form in both of two orders (NLL 0.053 /
    # 0.056, validation 31.9% / 15.3%; docs/probes.md, "SFT that lands in one place")
    config.sft.steps = 2400
    config.sft.batch_size = 16
    config.sft.lr = 3e-3
    config.sft.lr_schedule = "cosine"  # decayed to 0 at the last step: constant | cosine
    config.sft.data_seed = -1  # the order SFT reads its samples in; -1: config.seed
    # "": the oracle's (and the slipping teacher's) episodes on the train split, played by the
    # sft phase; a folder of .npz samples (t1jax.rollout.sample): SFT trains on those instead
    config.sft.data_dir = ""
    config.sft.checkpoint_every = 50  # a killed SFT resumes from its last multiple of this
    # every train task's SFT data hold the reference episode and a teacher's slip
    # (t1jax.curation.families.slip_command), so SFT imitates a teacher right half the time and
    # reward has something to teach that imitation cannot: with the reference alone PPO had
    # nothing to improve (docs/probes.md, "A teacher that slips"); False: the perfect teacher
    config.sft.teacher_slips = True

    # Critic Warm-Up until the critic is healthy (the recipe's point: PPO starts from a critic
    # that predicts returns): it stops once explained variance on each step's fresh rollouts,
    # averaged over ev_window steps, is above min_ev (after min_steps); `steps` caps it, and
    # reaching the cap unhealthy is logged and recorded in warmup/DONE. ev_window=0: exactly
    # `steps` steps. A fixed 4 steps left it below zero (-0.19 at the end; issue #47)
    config.warmup = ml_collections.ConfigDict()
    config.warmup.steps = 30
    config.warmup.min_steps = 4
    config.warmup.ev_window = 3
    config.warmup.min_ev = 0.0

    # 40 steps of 8 trials (320 trials, ~53 per family): with 20, each family had ~27 trials
    # in all, and in issue #47's +1.4-point run three families rose and three fell; on
    # validation a 61-step arm from the slipping teacher's SFT still climbed from step 20
    # (13.9%) to 40 (15.3%) (docs/probes.md, "A teacher that slips"). The seed runs since
    # (docs/probes.md, issue #47) were no higher at step 40 than at 20: not yet re-chosen
    config.ppo = ml_collections.ConfigDict()
    config.ppo.steps = 40

    config.eval = eval_config()
    config.eval.every = 10  # PPO steps between validation evaluations (0: only at the end)

    config.sandbox = sandbox_config()
    config.sandbox.concurrency = 6  # episodes mostly wait on the engine: 6 keep its batch full
    config.verifier = verifier_config()

    # the `aot` phase (not run by default: --config.phases=aot under .venv-tpu): this run's
    # steps compiled for a TPU topology on any host, failing when one does not fit in HBM
    # (t1jax/jobs/aot.py; BUILD.md "Ahead-of-time TPU checks")
    config.aot = ml_collections.ConfigDict()
    config.aot.topology = "v5p:2x2x2"  # e.g. v5p:4x4x8 (v5p-256: 128 chips on 32 hosts)
    config.aot.mesh = ""  # "data,fsdp,expert,tensor" over the topology's chips; "": config.mesh
    config.aot.steps = "actor,critic,prefill,decode"  # and "ppo": both halves in one program
    config.aot.model = ""  # a model config file (configs/model/*.py[:arg]) to check instead
    config.aot.rows = 0  # training rows; 0: one per batch-axis chip per minibatch
    config.aot.length = 0  # tokens per row; 0: rl.max_length
    config.aot.prefill = 4096  # engine prefill tokens per row (at most the row length)
    config.aot.engine_rows = 0  # engine rows; 0: the mesh's batch-axis chips
    return config
