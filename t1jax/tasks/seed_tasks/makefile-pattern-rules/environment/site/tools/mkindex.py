#!/usr/bin/env python3
"""Write an index page linking to the given pages.

    python3 tools/mkindex.py OUTPUT.html PAGE.html [PAGE.html ...]

Links are sorted by file name; each page's <title> is used as the link text. If the environment
variable MD2HTML_LOG names a file, the line "INDEX" is appended to it.
"""
import html
import os
import re
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: mkindex.py OUTPUT.html PAGE.html [PAGE.html ...]")
    out, pages = sys.argv[1], sys.argv[2:]
    items = []
    for page in sorted(pages, key=os.path.basename):
        if os.path.abspath(page) == os.path.abspath(out):
            continue
        with open(page) as f:
            m = re.search(r"<title>(.*?)</title>", f.read(), re.S)
        name = os.path.basename(page)
        items.append(f'<li><a href="{html.escape(name)}">{m.group(1) if m else name}</a></li>')
    with open(out, "w") as f:
        f.write("<!DOCTYPE html>\n<html><head><title>Index</title></head><body>\n<h1>Index</h1>\n<ul>\n"
                + "\n".join(items) + "\n</ul>\n</body></html>\n")
    log = os.environ.get("MD2HTML_LOG")
    if log:
        with open(log, "a") as f:
            f.write("INDEX\n")


if __name__ == "__main__":
    main()
