import os
import subprocess

import pytest

TOOL = "/app/cronwhen"
CRONTAB = """# test crontab
PATH=/usr/bin:/bin

*/15 * * * * quarter
0 9-17 * * mon-fri workhours
30 2 1,15 * *\tbackup --full
0 0 * * 7 sunday-seven
0 0 * * SUN sunday-name
5 4 * JAN,jul * half-yearly
0 12 13 * 5 friday-or-13th
*/10 8-18/2 * * * even-hours
@hourly hourly-job
@daily   daily-job   --flag   "two  spaces"   
0 12 * * 1-5/2 mon-wed-fri-noon
0,30 12 */2 * * odd-days-noon
0 12 10-20 * */3 dom-range-dowstar
@yearly new-year
@monthly first-of-month
\t  # indented comment
"""
INVALID = """60 * * * * bad-minute
* 24 * * * bad-hour
* * 0 * * bad-dom
* * * 13 * bad-month
* * * * 8 bad-dow
5-1 * * * * reversed
*/0 * * * * step-zero
* * * *   
* * * * * ok-every-minute
@reboot rebooting
@daily
1,,2 * * * * empty-item
* * * foo * bad-name
5/10 * * * * step-on-value
* * * * * also-ok
* * * *
"""


@pytest.fixture
def crontab(tmp_path):
    p = tmp_path / "crontab"
    p.write_text(CRONTAB)
    return p


def run(*args):
    return subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, timeout=30)


def due(crontab, ts):
    res = run(crontab, ts)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_executable():
    assert os.path.isfile(TOOL) and os.access(TOOL, os.X_OK)


def test_wildcards_steps_and_ranges(crontab):
    assert due(crontab, "2024-03-15 09:00") == ["quarter", "workhours", "hourly-job"]
    assert due(crontab, "2024-03-14 12:30") == ["quarter", "even-hours"]
    assert due(crontab, "2024-03-14 12:07") == []


def test_lists_and_names(crontab):
    assert due(crontab, "2024-07-09 04:05") == ["half-yearly"]
    assert due(crontab, "2024-01-20 04:05") == ["half-yearly"]
    assert due(crontab, "2024-02-20 04:05") == []
    assert due(crontab, "2024-03-15 02:30") == ["quarter", "backup --full"]


def test_day_of_month_or_day_of_week(crontab):
    # Friday the 13th, Wednesday the 13th, plain Friday, plain Thursday
    assert due(crontab, "2024-09-13 12:00") == ["quarter", "workhours", "friday-or-13th", "even-hours",
                                                "hourly-job", "mon-wed-fri-noon", "odd-days-noon"]
    assert due(crontab, "2024-03-13 12:00") == ["quarter", "workhours", "friday-or-13th", "even-hours",
                                                "hourly-job", "mon-wed-fri-noon", "odd-days-noon",
                                                "dom-range-dowstar"]
    assert "friday-or-13th" in due(crontab, "2024-03-22 12:00")
    assert "friday-or-13th" not in due(crontab, "2024-03-14 12:00")


def test_sunday_and_macros(crontab):
    assert due(crontab, "2024-03-17 00:00") == ["quarter", "sunday-seven", "sunday-name", "hourly-job",
                                                'daily-job   --flag   "two  spaces"']
    assert due(crontab, "2025-01-01 00:00") == ["quarter", "hourly-job", 'daily-job   --flag   "two  spaces"',
                                                "new-year", "first-of-month"]
    assert due(crontab, "2025-02-01 00:00") == ["quarter", "hourly-job", 'daily-job   --flag   "two  spaces"',
                                                "first-of-month"]


def test_invalid_lines(tmp_path):
    p = tmp_path / "bad"
    p.write_text(INVALID)
    res = run(p, "2024-05-05 05:05")
    assert res.returncode == 1
    assert res.stdout.splitlines() == ["ok-every-minute", "also-ok"]
    reported = sorted(int(l.split()[1].rstrip(":")) for l in res.stderr.splitlines()
                      if l.startswith("line "))
    assert reported == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 16]
    assert "line 8: invalid" in res.stderr.splitlines()


def test_usage_errors(crontab, tmp_path):
    assert run().returncode == 2
    assert run(crontab).returncode == 2
    assert run(crontab, "2024-03-15 09:00", "extra").returncode == 2
    assert run(crontab, "2024-02-30 10:00").returncode == 2
    assert run(crontab, "2024-03-15T09:00").returncode == 2
    res = run(tmp_path / "missing", "2024-03-15 09:00")
    assert res.returncode == 2 and res.stderr.strip()
