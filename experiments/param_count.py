"""Print a model config's parameter counts next to the published sizes.

  python experiments/param_count.py configs/model/qwen3_30b_a3b.py
  python experiments/param_count.py configs/model/tiny.py [more configs...]

A `path.py:arg` suffix is passed to get_config, as with --config. Why: the analytic count is
how we check that a config's shapes are really the model it claims to be (within 2%; Qwen3.5's
cards round to whole billions, so e.g. 35B-A3B's 3.46B active reads +15%: see its config).
"""

from __future__ import annotations

import argparse


from t1jax.jobs.config_file import load_config_file  # noqa: E402
from t1jax.model.config import model_config_from  # noqa: E402
from t1jax.model.sizes import param_counts  # noqa: E402




def report(spec: str) -> str:
    config = load_config_file(spec)
    counts = param_counts(model_config_from(config.model))
    lines = [spec]
    scale, unit = (1e9, "B") if counts["total"] >= 1e9 else (1e6, "M")
    width = max(10, *map(len, counts))  # Qwen3.5 adds linear_attention, shared_expert
    for key, n in counts.items():
        lines.append(f"  {key:<{width}} {n:>17,}  {n / scale:9.3f} {unit}")
    for key, name in (("total", "published_params_b"), ("active", "published_active_b")):
        if name in config:
            published = config[name]
            rel = counts[key] / (published * 1e9) - 1
            lines.append(f"  {key} vs published {published} B: {rel:+.2%}")
    if "mesh" in config:
        m = config.mesh
        lines.append(f"  mesh: data={m.data} fsdp={m.fsdp} expert={m.expert} tensor={m.tensor}"
                     f" ({m.devices})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="config file(s), optionally path.py:arg")
    args = parser.parse_args(argv)
    print("\n\n".join(report(spec) for spec in args.configs))


if __name__ == "__main__":
    main()
