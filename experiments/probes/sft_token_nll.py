"""Where does the SFT policy's loss sit? Teacher-forced NLL of a main-job run's SFT checkpoint on
its own SFT samples, split into the tokens that name an entity or fixture (what a command must
copy from the instruction) and every other trained token (tool-call JSON, command words, the
final answer).

    .venv/bin/python experiments/probes/sft_token_nll.py runs/tiny_cpu [--samples 120]

Why: the main job's SFT lands anywhere from 1% to 26% on held-out tasks from run to run; this
says whether the spread is in the boilerplate or in copying (docs/probes.md)."""

import argparse
from pathlib import Path


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from configs import tiny_cpu  # noqa: E402
from t1jax.jobs.build import restored_actor  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.model.transformer import CausalLM  # noqa: E402
from t1jax.rollout.sample import load_samples  # noqa: E402
from t1jax.curation.families import ENTITIES, FIXTURES  # noqa: E402


def token_nll(run: Path, n_samples: int) -> dict[str, np.ndarray]:
    """{"entity": NLLs, "other": NLLs} over the trained tokens of the first n SFT samples."""
    model = restored_actor(CausalLM(model_config_from(tiny_cpu.get_config().model),
                                    nnx.Rngs(0)), run / "sft" / "checkpoints")
    tok = Tokenizer.from_file(str(run / "tokenizer.json"))
    names = set(ENTITIES) | set(FIXTURES)
    out = {"entity": [], "other": []}
    for sample in load_samples(run / "sft" / "sft_data")[:n_samples]:
        tokens = jnp.asarray(sample.tokens[None].astype(np.int32))
        logits = model(tokens, jnp.arange(tokens.shape[1])[None], jnp.ones_like(tokens)).logits
        logp = np.asarray(jax.nn.log_softmax(logits[0, :-1].astype(jnp.float32)))
        target = sample.tokens[1:]
        nll = -logp[np.arange(len(target)), target]
        for i in np.nonzero(sample.loss_mask[1:])[0]:
            word = tok.decode([int(target[i])]).strip()
            out["entity" if word in names else "other"].append(nll[i])
    return {k: np.asarray(v) for k, v in out.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a main-job workdir with sft/ and tokenizer.json")
    parser.add_argument("--samples", type=int, default=120)
    args = parser.parse_args()
    parts = token_nll(args.run, args.samples)
    total = sum(v.sum() for v in parts.values())
    for kind, v in parts.items():
        print(f"{kind:>6}: {len(v)} tokens, mean NLL {v.mean():.3f}, share of the loss "
              f"{v.sum() / total:.2f}, P(target) < 0.5 for {(v > np.log(2)).mean():.0%}")


if __name__ == "__main__":
    main()
