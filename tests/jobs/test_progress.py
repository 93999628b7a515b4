"""Jobs off a terminal (`| tee`, nohup, CI) print plain progress lines: at a bar's start, at
most every interval while it moves, and at its end, with rate, elapsed time, ETA and info."""

import io

from t1jax.jobs.progress import PlainProgress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_lines_are_rate_limited_and_say_how_far():
    out, clock = io.StringIO(), Clock()
    with PlainProgress(interval_s=30.0, out=out, clock=clock) as bars:
        sft = bars.add_task("SFT", total=600, info="")
        for step in range(1, 601):
            clock.now += 0.5  # 2 steps a second: a line every 60 steps, and the last
            bars.update(sft, completed=step, info=f"sft/nll {1.0 / step:.3f}")
        episodes = bars.add_task("eval sft: trials", total=4, info="")
        bars.advance(episodes)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[progress] SFT: 0/600 (0%) | elapsed 0m00s"
    sft_lines = [line for line in lines if line.startswith("[progress] SFT:")]
    assert len(sft_lines) == 1 + 600 // 60  # the start, every 30 s, the end (step 600)
    assert sft_lines[1] == ("[progress] SFT: 60/600 (10%) | 2.00/s | elapsed 0m30s | "
                            "ETA 4m30s | sft/nll 0.017")
    assert sft_lines[-1].startswith("[progress] SFT: 600/600 (100%) | 2.00/s | elapsed 5m00s")
    assert "ETA" not in sft_lines[-1]
    # an interrupted bar says where it stopped when the bars close
    assert lines[-2:] == ["[progress] eval sft: trials: 0/4 (0%) | elapsed 0m00s",
                          "[progress] eval sft: trials: 1/4 (25%) | elapsed 0m00s"]


def test_slow_rates_read_per_minute_and_totals_may_come_later():
    out, clock = io.StringIO(), Clock()
    bars = PlainProgress(interval_s=10.0, out=out, clock=clock)
    task = bars.add_task("PPO")
    clock.now += 120.0
    bars.update(task, total=20, completed=1, info="reward/mean 0.412")
    assert out.getvalue().splitlines()[-1] == (
        "[progress] PPO: 1/20 (5%) | elapsed 2m00s | reward/mean 0.412")  # no rate yet
    clock.now += 120.0
    bars.update(task, completed=2)
    assert out.getvalue().splitlines()[-1] == (
        "[progress] PPO: 2/20 (10%) | 0.50/min | elapsed 4m00s | ETA 36m00s | reward/mean 0.412")


def test_a_resumed_stage_counts_its_rate_from_where_it_resumed():
    out, clock = io.StringIO(), Clock()
    bars = PlainProgress(interval_s=10.0, out=out, clock=clock)
    task = bars.add_task("SFT", total=600)
    clock.now += 5.0
    bars.update(task, completed=101)  # restored from the step-100 checkpoint
    clock.now += 10.0
    bars.update(task, completed=106)
    assert out.getvalue().splitlines()[-1] == (
        "[progress] SFT: 106/600 (18%) | 0.50/s | elapsed 0m15s | ETA 16m28s")
