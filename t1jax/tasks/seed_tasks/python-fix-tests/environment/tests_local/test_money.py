from decimal import Decimal as D

import pytest

from billing.money import apply_discount, format_amount, parse_amount, split_evenly


@pytest.mark.parametrize("text, expected", [
    ("$1,234.50", D("1234.50")), ("-$5", D("-5")), ("12.5", D("12.5")), (" 7 ", D("7")),
    ("($12.00)", D("-12.00")), ("(12)", D("-12")),
])
def test_parse_amount(text, expected):
    assert parse_amount(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1.234", "$-5", "1,23", "(-5)", "(5"])
def test_parse_amount_rejects(text):
    with pytest.raises(ValueError):
        parse_amount(text)


@pytest.mark.parametrize("value, expected", [
    (D("1234.5"), "$1,234.50"), (D("-5"), "-$5.00"), (D("0.125"), "$0.13"), (D("-0.125"), "-$0.13"),
    (D("1000000"), "$1,000,000.00"),
])
def test_format_amount(value, expected):
    assert format_amount(value) == expected


def test_split_evenly():
    assert split_evenly(D("10.00"), 3) == [D("3.34"), D("3.33"), D("3.33")]
    assert split_evenly(D("0.05"), 3) == [D("0.02"), D("0.02"), D("0.01")]
    assert split_evenly(D("9"), 1) == [D("9")]
    with pytest.raises(ValueError):
        split_evenly(D("1"), 0)


def test_apply_discount():
    assert apply_discount(D("10.00"), 25) == D("7.50")
    assert apply_discount(D("0.25"), 50) == D("0.13")
    assert apply_discount(D("8.00"), 0) == D("8.00")
    assert apply_discount(D("8.00"), 100) == D("0.00")
    for bad in (-1, 101):
        with pytest.raises(ValueError):
            apply_discount(D("8.00"), bad)
