import importlib.util
import json
import subprocess

import pytest


def _stats():
    spec = importlib.util.spec_from_file_location("stats_under_test", "/app/stats.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mean_true_division():
    s = _stats()
    assert s.mean([1, 2]) == 1.5
    assert s.mean([7, 8, 10]) == pytest.approx(25 / 3)
    assert s.mean([-3, 4]) == 0.5
    with pytest.raises(ValueError):
        s.mean([])


def test_median_even_length():
    s = _stats()
    data = [10, 2, 38, 23, 38, 23]
    assert s.median(data) == 23
    assert s.median([9, 1, 5, 3]) == 4
    assert s.median([1.5, -2.0]) == pytest.approx(-0.25)
    assert s.median([5, 1, 3]) == 3
    assert data == [10, 2, 38, 23, 38, 23], "median must not modify its input"


def test_mode_ties_pick_smallest():
    s = _stats()
    assert s.mode([5, 9, 9, 5, 7]) == 5
    assert s.mode([4, 4, 1, 2, 2, 8, 8]) == 2
    assert s.mode([-1, -3, 0, -1, -3]) == -3
    assert s.mode([6, 6, 2]) == 6
    with pytest.raises(ValueError):
        s.mode([])


def test_summarize():
    s = _stats()
    got = s.summarize([4, 8, 15, 16, 23, 42, 8, 4])
    assert set(got) == {"count", "mean", "median", "mode", "min", "max"}
    assert got["count"] == 8 and got["min"] == 4 and got["max"] == 42
    assert got["mean"] == pytest.approx(15.0) and got["median"] == 11.5 and got["mode"] == 4


def test_cli_outputs_json():
    res = subprocess.run(["python3", "/app/stats.py"], input="3 1 2 2 7 5\n",
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["mean"] == pytest.approx(10 / 3)
    assert got["median"] == 2.5 and got["mode"] == 2 and got["count"] == 6
