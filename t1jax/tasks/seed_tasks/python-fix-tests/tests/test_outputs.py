import hashlib
import importlib
import os
import subprocess
import sys
from decimal import Decimal as D

import pytest

LOCAL_SHA256 = {
    "conftest.py": "c14e668d5405e68ee34b3572ef50e8f3733343c7d3c4f80ab3205bb851928afe",
    "test_money.py": "4efc5a199556b47448bf6421c9d9edd7a534f6f3dc02df0b826965b791011c43",
}


@pytest.fixture(scope="module")
def money():
    sys.path.insert(0, "/app")
    try:
        sys.modules.pop("billing.money", None)
        sys.modules.pop("billing", None)
        yield importlib.import_module("billing.money")
    finally:
        sys.path.remove("/app")


def test_local_suite_passes():
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "/app/tests_local"],
                         cwd="/app", capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert res.returncode == 0, res.stdout[-3000:]
    assert "20 passed" in res.stdout


def test_parse_amount(money):
    cases = {"($1,000.05)": D("-1000.05"), "  -$0.5 ": D("-0.5"), "(7)": D("-7"),
             "12,345,678.9": D("12345678.9"), "$0": D("0"), " ($8.25) ": D("-8.25")}
    for text, expected in cases.items():
        assert money.parse_amount(text) == expected, text
    for text in ["(-$5)", "($5", "5)", "()", "1,2345", "$ 5", "--5", "12.345", "($-5)"]:
        with pytest.raises(ValueError):
            money.parse_amount(text)


def test_format_amount(money):
    cases = {D("-1234567.005"): "-$1,234,567.01", D("999.995"): "$1,000.00", D("2.675"): "$2.68",
             D("-42"): "-$42.00", D("0.004"): "$0.00", D("1234"): "$1,234.00", D("-0.015"): "-$0.02"}
    for value, expected in cases.items():
        assert money.format_amount(value) == expected, value


def test_split_evenly(money):
    for total, parts in [("1.00", 7), ("0.00", 3), ("100", 6), ("0.02", 5), ("7.77", 4), ("0.05", 2)]:
        got = money.split_evenly(D(total), parts)
        assert len(got) == parts
        assert sum(got) == D(total), (total, parts, got)
        cents = [int(x * 100) for x in got]
        assert all(x * 100 == int(x * 100) for x in got)
        assert max(cents) - min(cents) <= 1, (total, parts, got)
        assert cents == sorted(cents, reverse=True), (total, parts, got)
    with pytest.raises(ValueError):
        money.split_evenly(D("5"), -2)


def test_apply_discount(money):
    cases = [("19.99", 15, "16.99"), ("10.05", 50, "5.03"), ("3.30", 0, "3.30"), ("3.30", 100, "0.00"),
             ("0.10", D("12.5"), "0.09"), ("200", D("33.3"), "133.40")]
    for amount, percent, expected in cases:
        assert money.apply_discount(D(amount), percent) == D(expected), (amount, percent)
    for percent in (D("100.01"), -5, D("-0.1")):
        with pytest.raises(ValueError):
            money.apply_discount(D("1.00"), percent)


def test_invariant_local_tests_unchanged():
    for name, digest in LOCAL_SHA256.items():
        with open(os.path.join("/app/tests_local", name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name
