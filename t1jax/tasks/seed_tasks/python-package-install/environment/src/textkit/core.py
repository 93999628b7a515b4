"""Counting helpers."""
import string
from importlib import resources


def load_stopwords():
    """The bundled stop-word list (textkit/data/stopwords.txt), lower-cased."""
    text = resources.files("textkit").joinpath("data/stopwords.txt").read_text(encoding="utf-8")
    return {w.strip().lower() for w in text.splitlines() if w.strip() and not w.startswith("#")}


def count_text(text, stopwords=None):
    """(lines, words, chars): newline count, whitespace-separated tokens, characters.

    With a stop-word set, tokens whose lower-cased form (surrounding punctuation removed)
    is a stop word are not counted as words."""
    tokens = text.split()
    if stopwords is not None:
        tokens = [t for t in tokens if t.strip(string.punctuation).lower() not in stopwords]
    return text.count("\n"), len(tokens), len(text)
