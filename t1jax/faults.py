"""Preemption on cue, for the chaos tests: with T1JAX_KILL_AT=<stage>:<step>:<point> set, the
process SIGKILLs itself when the job reaches that point (as a preempted machine would: no
cleanup, no flush). Training-loop points: `collected` (rollouts in hand, no update yet),
`updated` (an update applied, its checkpoint not yet started), `saving` (a checkpoint's write
in flight). Phases that work episode by episode count their episodes instead
(`killing_progress`): `pool:1:written`, `oracle:<n>:episode`, `sft_data:<n>:episode`,
`eval_<label>:<n>:trial`. Unset, as in every real run, it is one environment lookup."""

import itertools
import os
import signal
import threading


def kill_point(stage: str, step: int, point: str) -> None:
    if os.environ.get("T1JAX_KILL_AT") == f"{stage}:{step}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)


def killing_progress(progress, stage: str, point: str, kind: str | None = None):
    """`progress` (a callback, or None) whose n-th call is kill point <stage>:<n>:<point>;
    with `kind`, only calls whose first argument is `kind` count (the pool and eval helpers
    also report image builds). Returns `progress` itself when no kill is set for `stage`."""
    if not os.environ.get("T1JAX_KILL_AT", "").startswith(f"{stage}:"):
        return progress
    counter, lock = itertools.count(1), threading.Lock()

    def tick(*args, **kwargs):
        if progress is not None:
            progress(*args, **kwargs)
        if kind is None or (args and args[0] == kind):
            with lock:
                n = next(counter)
            kill_point(stage, n, point)
    return tick
