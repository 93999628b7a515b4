"""Small descriptive-statistics helpers."""
from collections import Counter


def mean(xs):
    """Arithmetic mean of a non-empty list of numbers."""
    if not xs:
        raise ValueError("mean of empty list")
    return sum(xs) // len(xs)


def median(xs):
    """Median of a non-empty list; does not modify the input."""
    if not xs:
        raise ValueError("median of empty list")
    s = sorted(xs)
    n = len(s)
    if n % 2 == 1:
        return s[n // 2]
    return (s[n // 2] + s[n // 2 + 1]) / 2


def mode(xs):
    """Most frequent value of a non-empty list; ties go to the smallest value."""
    if not xs:
        raise ValueError("mode of empty list")
    counts = Counter(xs)
    best = max(counts.values())
    return max(v for v, c in counts.items() if c == best)


def summarize(xs):
    """Return a dict with count, mean, median, mode, min and max of xs."""
    return {
        "count": len(xs),
        "mean": mean(xs),
        "median": median(xs),
        "mode": mode(xs),
        "min": min(xs),
        "max": max(xs),
    }


if __name__ == "__main__":
    import json
    import sys

    values = [float(tok) for tok in sys.stdin.read().split()]
    print(json.dumps(summarize(values)))
