#!/usr/bin/env python3
"""invtool: summarise an inventory CSV (see /app/invtool/README.md)."""
import argparse
import csv
import io
import json
import sys

REQUIRED = ("sku", "name", "category", "qty", "unit_price")


def build_parser():
    parser = argparse.ArgumentParser(prog="invtool", description="Summarise an inventory CSV.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summarize", help="list and total the inventory")
    s.add_argument("file", help="inventory CSV file")
    s.add_argument("--min-qty", default="0", help="only items with qty >= N")
    s.add_argument("--category", action="store", default=None,
                   help="only items of this category (repeatable, case-insensitive)")
    s.add_argument("--sort", choices=["name", "qty", "value"], default="sku")
    s.add_argument("--desc", action="store_true", help="sort descending")
    s.add_argument("--top", type=int, default=None, help="only the first K items")
    s.add_argument("--format", choices=["table", "json", "csv"], default="table")
    return parser


def fail(message, code):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def load(path):
    try:
        with open(path, newline="") as f:
            text = f.read()
    except OSError:
        fail(f"cannot read {path}", 1)
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        fail(f"line 1: missing column(s): {', '.join(missing)}", 4)
    items = []
    for lineno, row in enumerate(reader, start=1):
        try:
            qty = int(row["qty"])
            price = float(row["unit_price"])
        except (TypeError, ValueError):
            continue
        items.append({"sku": row["sku"], "name": row["name"], "category": row["category"],
                      "qty": qty, "value": qty * price, "raw_qty": row["qty"]})
    return items


def summarize(args):
    items = load(args.file)
    cats = {args.category} if args.category else None
    items = [i for i in items if i["raw_qty"] >= args.min_qty
             and (cats is None or i["category"] in cats)]
    key = args.sort if args.sort != "sku" else "sku"
    items.sort(key=lambda i: (i[key], i["sku"]), reverse=args.desc)
    total_qty = sum(i["qty"] for i in items)
    total_value = sum(i["value"] for i in items)
    if args.top is not None:
        items = items[:args.top]
    if args.format == "json":
        print(json.dumps({
            "items": [{"sku": i["sku"], "name": i["name"], "qty": i["qty"], "value": round(i["value"], 2)}
                      for i in items],
            "total_qty": total_qty, "total_value": round(total_value, 2)}))
    elif args.format == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(["sku", "name", "qty", "value"])
        for i in items:
            w.writerow([i["sku"], i["name"], i["qty"], round(i["value"], 2)])
    else:
        for i in items:
            print(f"{i['sku']:<10} {i['name']:<24} {i['qty']:>6} {i['value']:>12.2f}")
        print(f"TOTAL {total_qty} {total_value:.2f}")
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    return summarize(args)


if __name__ == "__main__":
    sys.exit(main())
