"""Verifier-result parsing (CTRF, JUnit, reward files) and the dense reward on a global scale."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from t1jax.verify.results import (Assertion, ResultsFormatError, parse_binary_reward, parse_ctrf,
                                  parse_junit)
from t1jax.verify.reward import GlobalScale, dense_reward

# What pytest-json-ctrf writes (snake_case extras, ms durations, message + trace on failure).
CTRF = json.dumps({"results": {
    "tool": {"name": "pytest"},
    "summary": {"tests": 3, "passed": 1, "failed": 1, "skipped": 1, "pending": 0, "other": 0,
                "start": 1730000000000, "stop": 1730000001250},
    "tests": [
        {"name": "tests/test_outputs.py::test_report_exists", "status": "passed",
         "duration": 1.5, "start": 1730000000.1, "stop": 1730000000.2,
         "file_path": "tests/test_outputs.py", "tags": []},
        {"name": "tests/test_outputs.py::test_report_content", "status": "failed",
         "raw_status": "call_failed", "duration": 250.0,
         "message": "The test failed in the call phase due to an assertion error",
         "trace": "def test_report_content():\n>       assert 'total' in text\nE       AssertionError",
         "file_path": "tests/test_outputs.py"},
        {"name": "tests/test_outputs.py::test_optional", "status": "skipped", "duration": 0,
         "file_path": "tests/test_outputs.py"},
    ]}})

# Shape of pytest --junitxml output, incl. a collection error and a failure + teardown error.
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="2" failures="1" skipped="1"
 tests="6" time="0.117" timestamp="2025-01-01T00:00:00+00:00" hostname="vm">
<testcase classname="" name="tests.test_broken" time="0.000"><error message="collection failure"
>ImportError while importing test module '/tests/test_broken.py'.</error></testcase>
<testcase classname="tests.test_outputs" name="test_ok" time="0.012" />
<testcase classname="tests.test_outputs" name="test_fail" time="0.001"><failure
 message="AssertionError: nope&#10;assert 1 == 2">&gt;   assert 1 == 2, "nope"</failure></testcase>
<testcase classname="tests.test_outputs" name="test_err" time="0.000"><error
 message="failed on setup with &quot;RuntimeError: setup boom&quot;">boom</error></testcase>
<testcase classname="tests.test_outputs" name="test_skip" time="0.000"><skipped type="pytest.skip"
 message="later">/tests/test_outputs.py:13: later</skipped></testcase>
<testcase classname="tests.test_outputs.TestK" name="test_m" time="0.5"><system-out>hi</system-out>
</testcase>
<testcase classname="tests.test_outputs" name="test_both" time="0.000"><failure message="assert False"
/><error message="failed on teardown">x</error></testcase>
</testsuite></testsuites>
"""


def statuses(assertions):
    return {a.name: a.status for a in assertions}


# ---- CTRF ---------------------------------------------------------------------------------

def test_ctrf_pytest_json_ctrf_document():
    got = parse_ctrf(CTRF, "ctrf.json")
    assert statuses(got) == {
        "tests/test_outputs.py::test_report_exists": "passed",
        "tests/test_outputs.py::test_report_content": "failed",
        "tests/test_outputs.py::test_optional": "skipped",
    }
    assert got[0].duration_s == pytest.approx(0.0015)
    assert got[1].duration_s == pytest.approx(0.25)
    assert got[1].message.startswith("The test failed in the call phase")
    assert "AssertionError" in got[1].message
    assert got[0].message == ""


def test_ctrf_status_mapping_dedupe_and_truncation():
    doc = {"results": {"tool": {"name": "x"}, "tests": [
        {"name": "a", "status": "pending"}, {"name": "b", "status": "other"},
        {"name": "c", "status": "passed"}, {"name": "c", "status": "failed", "trace": "t" * 5000},
        {"name": "c", "status": "passed", "duration": None}]}}
    got = parse_ctrf(json.dumps(doc), "ctrf.json")
    assert [(a.name, a.status) for a in got] == [
        ("a", "skipped"), ("b", "error"), ("c", "passed"), ("c [2]", "failed"), ("c [3]", "passed")]
    assert len(got[3].message) == 2000
    assert parse_ctrf('{"results": {"tests": []}}', "ctrf.json") == []


@pytest.mark.parametrize("text, problem", [
    ("{not json", "not valid JSON"),
    ("[]", '"results"'),
    ('{"results": {"summary": {}}}', "results.tests"),
    ('{"results": {"tests": [1]}}', "not an object"),
    ('{"results": {"tests": [{"status": "passed"}]}}', "name"),
    ('{"results": {"tests": [{"name": "a", "status": "PASS"}]}}', "unknown status"),
    ('{"results": {"tests": [{"name": "a", "status": "passed", "duration": "fast"}]}}', "duration"),
    ('{"results": {"tests": [{"name": "a", "status": "passed", "duration": NaN}]}}', "NaN"),
    ('{"results": {"tests": [{"name": "a", "status": "passed", "duration": -1}]}}', "duration"),
])
def test_ctrf_malformed(text, problem):
    with pytest.raises(ResultsFormatError, match=problem) as err:
        parse_ctrf(text, "/logs/verifier/ctrf.json")
    assert "/logs/verifier/ctrf.json" in str(err.value)


# ---- JUnit --------------------------------------------------------------------------------

def test_junit_pytest_document():
    got = parse_junit(JUNIT, "junit.xml")
    assert statuses(got) == {
        "tests.test_broken": "error",
        "tests.test_outputs::test_ok": "passed",
        "tests.test_outputs::test_fail": "failed",
        "tests.test_outputs::test_err": "error",
        "tests.test_outputs::test_skip": "skipped",
        "tests.test_outputs.TestK::test_m": "passed",
        "tests.test_outputs::test_both": "error",
    }
    by = {a.name: a for a in got}
    assert by["tests.test_broken"].message.startswith("collection failure\nImportError")
    assert by["tests.test_outputs::test_fail"].message.startswith("AssertionError: nope\nassert 1 == 2")
    assert by["tests.test_outputs.TestK::test_m"].duration_s == 0.5


def test_junit_single_testsuite_root_and_duplicates():
    xml = ('<testsuite name="s"><testcase classname="k" name="t"/>'
           '<testcase classname="k" name="t"><failure/></testcase>'
           '<testcase name="bare"/></testsuite>')
    assert [(a.name, a.status) for a in parse_junit(xml, "r.xml")] == [
        ("k::t", "passed"), ("k::t [2]", "failed"), ("bare", "passed")]


@pytest.mark.parametrize("text, problem", [
    ("<testsuites><testcase", "not valid XML"),
    ("", "not valid XML"),
    ("<html><testcase name='x'/></html>", "root element"),
    ('<testsuite><testcase classname="k"/></testsuite>', "name"),
    ('<testsuite><testcase name="t" time="soon"/></testsuite>', "duration"),
])
def test_junit_malformed(text, problem):
    with pytest.raises(ResultsFormatError, match=problem) as err:
        parse_junit(text, "/logs/verifier/junit.xml")
    assert "/logs/verifier/junit.xml" in str(err.value)


def test_junit_rejects_entity_bomb():
    bomb = ('<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
            + "".join(f' <!ENTITY lol{i} "{"&lol%s;" % (i - 1 or "") * 10}">\n' for i in range(1, 10))
            + ']>\n<testsuite><testcase name="&lol9;"/></testsuite>')
    with pytest.raises(ResultsFormatError, match="DOCTYPE") as err:
        parse_junit(bomb, "bomb.xml")
    assert "bomb.xml" in str(err.value)
    with pytest.raises(ResultsFormatError, match="DOCTYPE"):
        parse_junit('<!-- <a --><!DOCTYPE x SYSTEM "file:///etc/passwd"><testsuite/>', "x.xml")


def test_junit_doctype_text_inside_cdata_is_fine():
    xml = ('<testsuite><testcase classname="k" name="t"><system-out><![CDATA[<!DOCTYPE html>'
           '<!ENTITY x "y">]]></system-out></testcase></testsuite>')
    assert statuses(parse_junit(xml, "r.xml")) == {"k::t": "passed"}


def test_junit_from_a_real_pytest_run(tmp_path):
    (tmp_path / "test_generated.py").write_text(textwrap.dedent("""
        import pytest

        def test_passes():
            assert 1 + 1 == 2

        def test_fails():
            assert "total:" in "subtotal only", "report lacks a total"

        @pytest.mark.skip(reason="not today")
        def test_skipped():
            pass

        @pytest.fixture
        def broken():
            raise RuntimeError("setup boom")

        def test_setup_error(broken):
            pass

        class TestGroup:
            def test_in_class(self):
                pass
    """))
    report = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}", str(tmp_path / "test_generated.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = parse_junit(report.read_text(encoding="utf-8"), str(report))
    assert statuses(got) == {
        "test_generated::test_passes": "passed",
        "test_generated::test_fails": "failed",
        "test_generated::test_skipped": "skipped",
        "test_generated::test_setup_error": "error",
        "test_generated.TestGroup::test_in_class": "passed",
    }
    by = {a.name: a for a in got}
    assert "report lacks a total" in by["test_generated::test_fails"].message
    assert "setup boom" in by["test_generated::test_setup_error"].message


# ---- binary reward files ------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("1\n", 1.0), ("0", 0.0), ("0.0", 0.0), (" 0.5 ", 0.5), ("1e0", 1.0), ("-1", -1.0)])
def test_reward_txt(text, want):
    assert parse_binary_reward(text, "reward.txt") == want


@pytest.mark.parametrize("text", ["abc", "nan", "inf", "-Infinity", "", "  \n", "1_0", "1 0", "true"])
def test_reward_txt_malformed(text):
    with pytest.raises(ResultsFormatError) as err:
        parse_binary_reward(text, "/logs/verifier/reward.txt")
    assert "/logs/verifier/reward.txt" in str(err.value)


@pytest.mark.parametrize("text, want", [
    ('{"reward": 1}', 1.0), ('{"reward": 0.0, "extra": "x"}', 0.0), ("1", 1.0), ("0.25\n", 0.25)])
def test_reward_json(text, want):
    assert parse_binary_reward(text, "reward.json") == want


@pytest.mark.parametrize("text, problem", [
    ('{"score": 1}', '"reward" key'), ('{"reward": "1"}', "not a number"),
    ('{"reward": true}', "not a number"), ('{"reward": NaN}', "NaN"), ("[1]", "not a number"),
    ('{"reward": 1', "not valid JSON"), ('{"reward": 1e999}', "not finite")])
def test_reward_json_malformed(text, problem):
    with pytest.raises(ResultsFormatError, match=problem) as err:
        parse_binary_reward(text, "reward.json")
    assert "reward.json" in str(err.value)


# ---- global scale and dense reward --------------------------------------------------------

def test_global_scale_nearest_rank():
    scale = GlobalScale.from_counts([3, 4, 5, 10])
    assert scale == GlobalScale.from_counts([10, 5, 4, 3])
    assert scale.value == 10.0 and "p90" in scale.source and "4 tasks" in scale.source
    assert GlobalScale.from_counts([3, 4, 5, 10], quantile=0.5).value == 4.0
    assert GlobalScale.from_counts([3, 4, 5, 10], quantile=0.01).value == 3.0
    assert GlobalScale.from_counts([7]).value == 7.0


@pytest.mark.parametrize("counts, quantile", [
    ([], 0.9), ([3, 0], 0.9), ([3, -2], 0.9), ([2.5], 0.9), ([True], 0.9), ([3], 0), ([3], 1.5)])
def test_global_scale_rejects(counts, quantile):
    with pytest.raises(ValueError):
        GlobalScale.from_counts(counts, quantile)


def test_global_scale_value_validated():
    for bad in (0, 0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            GlobalScale(bad, "manual")


def _report(passed, failed=0):
    return ([Assertion(f"t{i}", "passed") for i in range(passed)]
            + [Assertion(f"f{i}", "failed") for i in range(failed)])


def test_dense_reward_counts_absolute_passes():
    scale = GlobalScale(10.0, "test")
    assert dense_reward(_report(3, 2), 0.0, scale) == (0.3, "dense")
    assert dense_reward(_report(3, 20), None, scale) == (0.3, "dense")  # not a ratio
    assert dense_reward(_report(15), 1.0, scale) == (1.5, "dense")  # not clipped
    skipped = [Assertion("s", "skipped"), Assertion("e", "error")]
    assert dense_reward(skipped, 0.0, scale) == (0.0, "dense")


def test_dense_reward_floor_for_solved_task():
    scale = GlobalScale(10.0, "test")
    assert dense_reward(_report(0, 4), 1.0, scale) == (0.1, "dense")
    assert dense_reward(_report(0, 4), 0.0, scale) == (0.0, "dense")


def test_binary_fallback_never_zero_when_solved():
    scale = GlobalScale(10.0, "test")
    assert dense_reward(None, 1.0, scale) == (1.0, "binary_fallback")
    assert dense_reward([], 0.5, scale) == (1.0, "binary_fallback")
    assert dense_reward(None, 0.0, scale) == (0.0, "binary_fallback")
    assert dense_reward(None, None, scale) == (0.0, "binary_fallback")
    with pytest.raises(ValueError):
        dense_reward(None, float("nan"), scale)


PYTEST_RA_OUTPUT = """\
============================= test session starts ==============================
collected 4 items

tests/test_outputs.py .F.x                                                 [100%]

=================================== FAILURES ===================================
___________________________________ test_two ___________________________________
E   assert 1 == 2
=========================== short test summary info ============================
PASSED tests/test_outputs.py::test_one
PASSED tests/test_outputs.py::test_three
SKIPPED [1] tests/test_outputs.py:20: not on this platform
XFAIL tests/test_outputs.py::test_four - known bug
FAILED tests/test_outputs.py::test_two - assert 1 == 2
ERROR tests/test_outputs.py::test_five - fixture 'db' not found
============== 1 failed, 2 passed, 1 xfailed, 1 error in 0.03s ================
"""


def test_pytest_summary_from_stdout():
    from t1jax.verify.results import parse_pytest_summary
    got = {a.name: (a.status, a.message) for a in parse_pytest_summary(PYTEST_RA_OUTPUT, "out")}
    assert got == {
        "tests/test_outputs.py::test_one": ("passed", ""),
        "tests/test_outputs.py::test_three": ("passed", ""),
        "tests/test_outputs.py::test_four": ("skipped", "known bug"),
        "tests/test_outputs.py::test_two": ("failed", "assert 1 == 2"),
        "tests/test_outputs.py::test_five": ("error", "fixture 'db' not found"),
    }
    # lines that merely look like results, before the summary header, are not counted
    assert parse_pytest_summary("PASSED tests/x.py::test_fake\n", "out") == []
