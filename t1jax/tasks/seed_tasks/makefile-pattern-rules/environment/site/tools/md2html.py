#!/usr/bin/env python3
"""Convert a tiny Markdown subset to HTML.

    python3 tools/md2html.py INPUT.md OUTPUT.html --template TEMPLATE.html

Supports "# " headings (h1-h3), "- " list items, `code` and paragraphs. The template's
{{title}} (first heading) and {{body}} are filled in. If the environment variable MD2HTML_LOG
names a file, the INPUT argument is appended to it as one line (for build bookkeeping).
"""
import html
import os
import re
import sys


def inline(text):
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def convert(lines):
    out, in_list, para, title = [], False, [], None

    def flush():
        nonlocal para
        if para:
            out.append("<p>" + inline(" ".join(para)) + "</p>")
            para = []

    for line in lines:
        line = line.rstrip("\n")
        m = re.match(r"(#{1,3}) (.*)", line)
        if m:
            flush()
            level = len(m.group(1))
            title = title or m.group(2)
            out.append(f"<h{level}>{inline(m.group(2))}</h{level}>")
        elif line.startswith("- "):
            flush()
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{inline(line[2:])}</li>")
            continue
        elif not line.strip():
            flush()
        else:
            para.append(line.strip())
        if in_list and not line.startswith("- "):
            out.insert(len(out) - (1 if m else 0), "</ul>")
            in_list = False
    flush()
    if in_list:
        out.append("</ul>")
    return title or "Untitled", "\n".join(out)


def main():
    args = sys.argv[1:]
    if len(args) != 4 or args[2] != "--template":
        sys.exit("usage: md2html.py INPUT.md OUTPUT.html --template TEMPLATE.html")
    src, dst, template = args[0], args[1], args[3]
    with open(src) as f:
        title, body = convert(f.readlines())
    with open(template) as f:
        page = f.read().replace("{{title}}", html.escape(title)).replace("{{body}}", body)
    with open(dst, "w") as f:
        f.write(page)
    log = os.environ.get("MD2HTML_LOG")
    if log:
        with open(log, "a") as f:
            f.write(src + "\n")


if __name__ == "__main__":
    main()
