"""What a run leaves for people to look at, and how runs are compared: `summary` (summary.md of
a run's metrics and evaluations; `python -m t1jax.report WORKDIR`), `plots` (its figures),
`viewer` (the self-contained trajectories.html), `browser` (trials as tables and text, for
notebooks), `ablation` (single-axis arms run from a base run and read back) and `paired` (two
evaluations' difference task by task, with its noise)."""
