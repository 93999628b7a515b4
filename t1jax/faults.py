"""Preemption on cue, for the chaos tests: with T1JAX_KILL_AT=<stage>:<step>:<point> set, the
process SIGKILLs itself when the training loop reaches that point (as a preempted machine would:
no cleanup, no flush). Points: `collected` (rollouts in hand, no update yet), `updated` (an
update applied, its checkpoint not yet started), `saving` (a checkpoint's write in flight). Unset,
as in every real run, it is one environment lookup."""

import os
import signal


def kill_point(stage: str, step: int, point: str) -> None:
    if os.environ.get("T1JAX_KILL_AT") == f"{stage}:{step}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)
