"""Money helpers for the billing service.

Amounts are decimal.Decimal values in dollars. Rounding to cents is always
"half up" (away from zero on an exact half): 0.125 -> 0.13, -0.125 -> -0.13.
"""
import re
from decimal import ROUND_HALF_EVEN, Decimal

CENT = Decimal("0.01")
_NUMBER = re.compile(r"(\d{1,3}(,\d{3})+|\d+)(\.\d{1,2})?")


def _cents(value):
    """Round a Decimal to whole cents (half up)."""
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_EVEN)


def parse_amount(text):
    """Parse a dollar amount string into a Decimal.

    Accepted: optional surrounding whitespace, then an optional "-", an optional "$", and a
    number with optional thousands separators (groups of three digits) and at most two
    decimals: "$1,234.50", "-$5", "12.5", " 7 ". An amount wrapped in parentheses is
    negative (accounting style): "($12.00)" and "(12)" mean -12. Anything else raises
    ValueError, e.g. "", "abc", "1.234", "$-5", "1,23", "(-5)", "(5".
    """
    s = text.strip()
    negative = False
    if s.startswith("-"):
        negative = True
        s = s[1:]
    if s.startswith("$"):
        s = s[1:]
    if not _NUMBER.fullmatch(s):
        raise ValueError(f"not an amount: {text!r}")
    value = Decimal(s.replace(",", ""))
    return -value if negative else value


def format_amount(value):
    """Format a Decimal as dollars: rounded (half up) to cents, thousands separators, and
    a leading "-" before the "$" for negative amounts: "$1,234.50", "-$5.00", "$0.13"."""
    q = _cents(value)
    return f"${q:,.2f}"


def split_evenly(total, parts):
    """Split a non-negative amount into `parts` amounts (whole cents) that sum exactly to
    the total (rounded to cents) and differ from each other by at most one cent; the
    larger amounts come first: split_evenly(Decimal("10.00"), 3) == [3.34, 3.33, 3.33].
    Raises ValueError if parts < 1."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    cents = int(_cents(total) * 100)
    base, extra = divmod(cents, parts)
    result = [Decimal(base) / 100 for _ in range(parts)]
    result[-1] += Decimal(extra) / 100
    return result


def apply_discount(amount, percent):
    """Amount after a percentage discount, rounded (half up) to cents.

    `percent` is a number from 0 to 100 inclusive (int or Decimal); anything outside that
    range raises ValueError. apply_discount(Decimal("10.00"), 25) == Decimal("7.50")."""
    percent = Decimal(percent)
    if not 0 < percent < 100:
        raise ValueError("percent must be between 0 and 100")
    return _cents(amount * (1 - percent / 100))
