"""`python -m t1jax.report WORKDIR`: write WORKDIR/report/ (see t1jax/report/summary.py)."""

from t1jax.report.summary import main

main()
