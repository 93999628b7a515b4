#!/bin/bash
# Apply the fixes to /app/invtool/cli.py:
#  1. --min-qty: type=int and compare numbers (was a string comparison)
#  2. --category: action="append" and case-insensitive matching
#  3. --sort: default "name" (was "sku"); ties by sku ascending even with --desc (two stable sorts)
#  4. --top: positive integers only (argparse error, exit 2)
#  5. totals computed after --top
#  6. unreadable FILE exits 3 (was 1)
#  7. malformed rows exit 4 with the right line number (were skipped silently)
#  8. csv values with exactly 2 decimals
set -euo pipefail
cd /app/invtool
python3 - <<'PY'
import re
p = "cli.py"
s = open(p).read()


def sub(old, new):
    global s
    assert old in s, old
    s = s.replace(old, new)


sub('''def build_parser():''', '''def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid positive integer: {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid positive integer: {text!r}")
    return value


def build_parser():''')
sub('''s.add_argument("--min-qty", default="0",''', '''s.add_argument("--min-qty", type=int, default=0,''')
sub('''s.add_argument("--category", action="store", default=None,''', '''s.add_argument("--category", action="append", default=None,''')
sub('''default="sku")''', '''default="name")''')
sub('''s.add_argument("--top", type=int,''', '''s.add_argument("--top", type=positive_int,''')
sub('''fail(f"cannot read {path}", 1)''', '''fail(f"cannot read {path}", 3)''')
sub('''enumerate(reader, start=1)''', '''enumerate(reader, start=2)''')
sub('''        except (TypeError, ValueError):
            continue''', '''        except (TypeError, ValueError):
            fail(f"line {lineno}: invalid qty or unit_price", 4)''')
sub(''', "raw_qty": row["qty"]}''', '''}''')
sub('''    cats = {args.category} if args.category else None
    items = [i for i in items if i["raw_qty"] >= args.min_qty
             and (cats is None or i["category"] in cats)]
    key = args.sort if args.sort != "sku" else "sku"
    items.sort(key=lambda i: (i[key], i["sku"]), reverse=args.desc)
    total_qty = sum(i["qty"] for i in items)
    total_value = sum(i["value"] for i in items)
    if args.top is not None:
        items = items[:args.top]
''', '''    cats = {c.lower() for c in args.category} if args.category else None
    items = [i for i in items if i["qty"] >= args.min_qty
             and (cats is None or i["category"].lower() in cats)]
    items.sort(key=lambda i: i["sku"])
    items.sort(key=lambda i: i[args.sort], reverse=args.desc)  # stable: ties stay sku-ascending
    if args.top is not None:
        items = items[:args.top]
    total_qty = sum(i["qty"] for i in items)
    total_value = sum(i["value"] for i in items)
''')
sub('''round(i["value"], 2)])''', '''f"{i['value']:.2f}"])''')
open(p, "w").write(s)
PY
python3 cli.py summarize sample.csv
python3 cli.py summarize sample.csv --format csv --category HARDWARE --category books --sort value --desc
