"""Verification: grade a finished episode with the task's tests and score it as the dense
reward.

results.py: per-assertion results parsed from CTRF JSON, JUnit XML and reward files, so every
  report format gives the same list and a malformed one fails loudly.
reward.py: the dense reward: passing assertions counted on one fixed global scale per pool, so
  every assertion is worth the same everywhere.
verifier.py: runs the task's tests where Harbor does (in the agent's sandbox, or a fresh one from
  a snapshot), checks for tampering, and reports the results.
offline/: stand-in tools (apt-get, curl, uv/uvx, pip, a --ctrf plugin) for
  `verifier.mode = "offline"`, as sandboxes have no network (its README.md); not Python.
"""
