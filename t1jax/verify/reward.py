"""Dense process reward: passing assertions counted on one fixed, global scale (T1).

Why: a ratio (passed / total) makes one assertion on a 2-test task worth ten on a
20-test task and lets a task's own test count move the goalposts. T1 counts passed
assertions absolutely and divides by a single denominator chosen once per pool, so
every assertion is worth the same everywhere. Tasks with no per-assertion report
fall back to their binary outcome, so a solved task never scores zero.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from t1jax.verify.results import Assertion

DENSE, BINARY_FALLBACK = "dense", "binary_fallback"


@dataclass(frozen=True)
class GlobalScale:
    """Fixed denominator for the dense reward, chosen once from a pool's assertion counts and never moved (T1)."""

    value: float
    source: str

    def __post_init__(self):
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise ValueError(f"scale value must be a number, got {self.value!r}")
        if not math.isfinite(self.value) or self.value < 1:
            raise ValueError(f"scale value must be finite and >= 1, got {self.value!r}")

    @classmethod
    def from_counts(cls, counts: list[int], quantile: float = 0.9) -> "GlobalScale":
        """Nearest-rank quantile of per-task assertion counts (deterministic, an actual count).

        Tasks without a per-assertion report have no count: leave them out, don't pass 0.
        """
        counts = list(counts)
        if not counts:
            raise ValueError("cannot choose a global scale from no assertion counts")
        bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, int) or c < 1]
        if bad:
            raise ValueError(f"assertion counts must be positive integers, got {bad[:5]}")
        if isinstance(quantile, bool) or not 0 < quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
        ranked = sorted(counts)
        rank = max(1, math.ceil(quantile * len(ranked)))
        value = float(ranked[rank - 1])
        pct = f"{quantile * 100:g}"
        return cls(value, f"p{pct} (nearest rank) of {len(ranked)} tasks' assertion counts")


def _solved(binary: float | None) -> bool:
    if binary is None:
        return False
    if isinstance(binary, bool) or not isinstance(binary, (int, float)) or not math.isfinite(binary):
        raise ValueError(f"binary outcome must be a finite number or None, got {binary!r}")
    return binary > 0


def dense_reward(assertions: list[Assertion] | None, binary: float | None,
                 scale: GlobalScale) -> tuple[float, str]:
    """Passed assertions / scale.value, or the binary outcome when there is no report.

    Returns (reward, mode), mode "dense" or "binary_fallback".

    - Dense: the absolute number of passed assertions over the fixed scale. It is NOT
      clipped: a task with more assertions than the scale can exceed 1.0, by design,
      since clipping would make its extra assertions worthless.
    - If binary says solved but few or no assertions passed (an inconsistent report),
      the dense reward is floored at 1 / scale.value: a solved task never scores zero.
    - No report (None or an empty list): 1.0 if binary > 0 else 0.0. With no binary
      either, nothing shows the task solved, so 0.0.
    """
    solved = _solved(binary)
    if not assertions:
        return (1.0 if solved else 0.0), BINARY_FALLBACK
    passed = sum(1 for a in assertions if a.status == "passed")
    reward = passed / scale.value
    if solved:
        reward = max(reward, 1.0 / scale.value)
    return reward, DENSE


# Assertions named test_invariant_* check that the task's inputs stay intact (a do-nothing
# agent passes them); the others check the task's goal.
INVARIANT = re.compile(r"(^|[:.])test_invariant_")


def goal_assertions(report) -> list:
    """The report's assertions that check the task's goal (all but `test_invariant_*`)."""
    return [a for a in report.assertions if not INVARIANT.search(a.name)]


def static_assertion_count(task) -> int:
    """Test functions in a task's test files: what the pool's global scale is chosen from
    before any episode runs."""
    pattern = re.compile(r"^\s*(?:async\s+)?def\s+test_\w*\s*\(", re.M)
    return sum(len(pattern.findall(path.read_text(errors="replace")))
               for rel, path in task.test_files().items() if rel.endswith(".py"))


def pool_scale(tasks, quantile: float = 0.9, fixed: float = 0.0) -> GlobalScale:
    """The pool's fixed scale: `fixed` when > 0, else the quantile of its tasks' static
    assertion counts."""
    if fixed > 0:
        return GlobalScale(fixed, "fixed in the run config (verifier.global_scale)")
    counts = [max(static_assertion_count(t), 1) for t in tasks]
    return GlobalScale.from_counts(counts, quantile)
