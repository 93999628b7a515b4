"""Build /app/repo: 30 commits with fixed identities and dates (reproducible hashes).

test_word_frequencies passes up to commit 18 and fails from commit 19 ("Simplify tokenizer
pattern") on. test_sentence_count fails from commit 10 on for an unrelated reason, and
test_summary fails transiently at commits 7-8.
"""
import os
import subprocess

REPO = "/app/repo"
os.makedirs(REPO, exist_ok=True)
os.chdir(REPO)
N = [0]


def git(*args):
    subprocess.run(["git", *args], check=True, capture_output=True)


def write(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def edit(path, old, new):
    text = open(path).read()
    assert old in text, (path, old)
    write(path, text.replace(old, new, 1))


def commit(msg):
    N[0] += 1
    date = f"2024-02-{N[0]:02d}T09:{N[0]:02d}:00+00:00"
    env = dict(os.environ, GIT_AUTHOR_NAME="Sam Dev", GIT_AUTHOR_EMAIL="sam@example.com",
               GIT_COMMITTER_NAME="Sam Dev", GIT_COMMITTER_EMAIL="sam@example.com",
               GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(["git", "commit", "-q", "-m", msg], check=True, env=env)


git("init", "-q", "-b", "main")
write(".gitignore", "__pycache__/\n*.pyc\n.pytest_cache/\n")
write("README.md", "# textstats\n\nTiny text statistics helpers.\n")
write("textstats.py", '''"""Tiny text statistics helpers."""
import re
from collections import Counter

WORD_RE = re.compile(r"[A-Za-z']+")


def tokenize(text):
    """Words of `text`: runs of ASCII letters and apostrophes, lower-cased."""
    return [w.lower() for w in WORD_RE.findall(text)]


def word_frequencies(text):
    """Mapping word -> number of occurrences."""
    return dict(Counter(tokenize(text)))


# --- more helpers below ---
''')
write("tests/test_textstats.py", '''import textstats


def test_word_frequencies():
    text = "Don't panic. Don't PANIC, 42 towels; don't forget the towel!"
    assert textstats.word_frequencies(text) == {
        "don't": 3, "panic": 2, "towels": 1, "forget": 1, "the": 1, "towel": 1}
''')
write("conftest.py", "import os\nimport sys\n\nsys.path.insert(0, os.path.dirname(__file__))\n")
commit("Initial textstats with word frequencies")
git("tag", "v0.1")

# 2
with open("textstats.py", "a") as f:
    f.write('''

def top_words(text, n=3):
    """The n most frequent words, ties broken alphabetically."""
    freq = word_frequencies(text)
    return sorted(freq, key=lambda w: (-freq[w], w))[:n]
''')
with open("tests/test_textstats.py", "a") as f:
    f.write('''

def test_top_words():
    assert textstats.top_words("b a b c a b", 2) == ["b", "a"]
''')
commit("Add top_words")
# 3
edit("README.md", "helpers.\n", "helpers.\n\n## Install\n\nCopy `textstats.py` into your project.\n")
commit("Document installation")
# 4
with open("textstats.py", "a") as f:
    f.write('''

def sentence_count(text):
    """Number of sentences: runs of text ending in ., ! or ?"""
    return len(re.findall(r"[^.!?]+[.!?]", text))
''')
with open("tests/test_textstats.py", "a") as f:
    f.write('''

def test_sentence_count():
    assert textstats.sentence_count("One. Two! Three? Four") == 3
''')
commit("Add sentence_count")
# 5
write("docs/usage.md", "# Usage\n\n```python\nimport textstats\ntextstats.word_frequencies('a b a')\n```\n")
commit("Add usage docs")
# 6
with open("textstats.py", "a") as f:
    f.write('''

def avg_word_length(text):
    """Average length of the words of `text` (0.0 for no words)."""
    words = tokenize(text)
    return sum(map(len, words)) / len(words) if words else 0.0
''')
with open("tests/test_textstats.py", "a") as f:
    f.write('''

def test_avg_word_length():
    assert textstats.avg_word_length("ab abcd") == 3.0
    assert textstats.avg_word_length("") == 0.0
''')
commit("Add avg_word_length")
# 7 (summary broken: test_summary fails at 7 and 8)
with open("textstats.py", "a") as f:
    f.write('''

def summary(text):
    """A dict with words, unique, sentences."""
    words = tokenize(text)
    return {"words": len(words), "unique": len(words), "sentences": sentence_count(text)}
''')
with open("tests/test_textstats.py", "a") as f:
    f.write('''

def test_summary():
    assert textstats.summary("a b a. c!") == {"words": 4, "unique": 3, "sentences": 2}
''')
commit("Add summary")
# 8
write("cli.py", '''"""Command line: python3 cli.py FILE"""
import json
import sys

import textstats

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(textstats.summary(f.read()), indent=2))
''')
commit("Add command line entry point")
# 9
edit("textstats.py", '"unique": len(words)', '"unique": len(set(words))')
commit("Fix unique word count in summary")
# 10 (sentence_count regression that stays: unrelated known failure)
edit("textstats.py", 'return len(re.findall(r"[^.!?]+[.!?]", text))',
     'return len(re.findall(r"[^.!?]+[.!?]+", text.strip())) or 1')
edit("tests/test_textstats.py", '"One. Two! Three? Four") == 3', '"One. Two! Three? Four") == 3\n    assert textstats.sentence_count("") == 0')
commit("Count at least one sentence")
# 11
write("CHANGELOG.md", "# Changelog\n\n## 0.2\n\n- summary(), CLI\n")
commit("Add changelog")
# 12
edit("docs/usage.md", "```\n", "```\n\nSee also `cli.py`.\n", )
commit("Mention the CLI in the docs")
# 13
with open("textstats.py", "a") as f:
    f.write('''

def longest_word(text):
    """The longest word (first one on ties), or None."""
    words = tokenize(text)
    return max(words, key=len) if words else None
''')
with open("tests/test_textstats.py", "a") as f:
    f.write('''

def test_longest_word():
    assert textstats.longest_word("a bbb cc ddd") == "bbb"
    assert textstats.longest_word("") is None
''')
commit("Add longest_word")
# 14
edit("cli.py", '"""Command line: python3 cli.py FILE"""', '"""Command line: python3 cli.py FILE [FILE...]"""')
edit("cli.py", '''    with open(sys.argv[1]) as f:
        print(json.dumps(textstats.summary(f.read()), indent=2))''', '''    for path in sys.argv[1:]:
        with open(path) as f:
            print(json.dumps(textstats.summary(f.read()), indent=2))''')
commit("CLI: accept several files")
# 15
edit("README.md", "## Install", "## Features\n\n- word frequencies, top words\n- sentences, summary\n\n## Install")
commit("List features in README")
# 16
edit("textstats.py", '''    return {"words": len(words), "unique": len(set(words)), "sentences": sentence_count(text)}''',
     '''    return {"words": len(words), "unique": len(set(words)), "sentences": sentence_count(text),
            "longest": longest_word(text)}''')
edit("tests/test_textstats.py", '== {"words": 4, "unique": 3, "sentences": 2}',
     '== {"words": 4, "unique": 3, "sentences": 2,\n                                         "longest": "a"}')
commit("Include longest word in summary")
# 17
write("docs/api.md", "# API\n\n- tokenize\n- word_frequencies\n- top_words\n- sentence_count\n- summary\n")
commit("Add API reference")
# 18
edit("CHANGELOG.md", "## 0.2", "## 0.3\n\n- longest_word()\n\n## 0.2")
commit("Update changelog for 0.3")
# 19: the regression
edit("textstats.py", '''WORD_RE = re.compile(r"[A-Za-z']+")''', '''WORD_RE = re.compile(r"\\w+")''')
commit("Simplify tokenizer pattern")
# 20
edit("docs/api.md", "- summary\n", "- summary\n- longest_word\n- avg_word_length\n")
commit("Complete API reference")
# 21
with open("textstats.py", "a") as f:
    f.write('''

def char_count(text, spaces=True):
    """Number of characters, optionally without whitespace."""
    return len(text) if spaces else len("".join(text.split()))
''')
with open("tests/test_textstats.py", "a") as f:
    f.write('''

def test_char_count():
    assert textstats.char_count("a b\\tc") == 5
    assert textstats.char_count("a b\\tc", spaces=False) == 3
''')
commit("Add char_count")
# 22
edit("cli.py", "import json\n", "import json\nimport os\n")
edit("cli.py", '''        with open(path) as f:''', '''        if not os.path.isfile(path):
            sys.exit(f"no such file: {path}")
        with open(path) as f:''')
commit("CLI: clear error for missing files")
# 23
edit("README.md", "## Install", "## Requirements\n\nPython 3.8+\n\n## Install")
commit("Document requirements")
# 24
edit("textstats.py", '''    """The n most frequent words, ties broken alphabetically."""''',
     '''    """The n most frequent words, ties broken alphabetically.

    >>> top_words("b a b", 1)
    ['b']
    """''')
commit("Doctest for top_words")
# 25
write("Makefile", "test:\n\tpython3 -m pytest -q\n\n.PHONY: test\n")
commit("Add Makefile")
# 26
edit("CHANGELOG.md", "## 0.3", "## 0.4\n\n- char_count()\n- CLI error messages\n\n## 0.3")
commit("Update changelog for 0.4")
# 27
edit("textstats.py", '''    """Number of characters, optionally without whitespace."""''',
     '''    """Number of characters, optionally ignoring whitespace."""''')
commit("Wording")
# 28
edit("docs/usage.md", "See also `cli.py`.", "See also `cli.py` and `make test`.")
commit("Docs: mention make test")
# 29
with open("tests/test_textstats.py", "a") as f:
    f.write('''

def test_top_words_ties():
    assert textstats.top_words("z y x", 2) == ["x", "y"]
''')
commit("Test top_words tie-breaking")
# 30
edit("README.md", "Tiny text statistics helpers.", "Tiny, dependency-free text statistics helpers.")
commit("Polish README")
