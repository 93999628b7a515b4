"""What a run leaves for people to look at, and how runs are compared.

__main__.py: `python -m t1jax.report WORKDIR`: writes WORKDIR/report/ (see summary.py).
ablation.py: single-axis ablation arms run from a finished base run (reusing its pool, tokenizer,
  SFT actor and Critic Warm-Up) and read back, for the notebooks.
browser.py: a run's trials as tables, one trial as text, and its tokens with the loss mask made
  visible, for notebooks.
paired.py: two evaluations of one task set compared task by task (difference, standard error,
  bootstrap 95% interval), since tasks vary more than checkpoints do.
plots.py: the report's figures (training curves, evaluation per checkpoint, periodic evaluations);
  the only module that imports matplotlib.
summary.py: `write_report`: summary.md, plots and trajectories.html from what a run wrote, also
  for a run killed half-way (it lists what is missing).
viewer.py: the self-contained trajectories.html of a run's eval trials, with all model output
  escaped.
"""
