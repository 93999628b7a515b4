"""Command-line entry point: textkit-count [--ignore-stopwords] [--version] FILE..."""
import argparse
import sys
from importlib import metadata

from core import count_text, load_stopwords


def main(argv=None):
    parser = argparse.ArgumentParser(prog="textkit-count")
    parser.add_argument("--ignore-stopwords", action="store_true",
                        help="do not count the bundled stop words")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    if args.version:
        print(f"textkit-count {metadata.version('textkit')}")
        return 0
    if not args.files:
        parser.error("no input files")
    stop = load_stopwords() if args.ignore_stopwords else None
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            lines, words, chars = count_text(f.read(), stop)
        print(f"{path}: lines={lines} words={words} chars={chars}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
