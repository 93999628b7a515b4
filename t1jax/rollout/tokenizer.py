"""A small real byte-level BPE tokenizer, trained offline on a built-in corpus.

Why: TITO bugs only show up with a real merge-based tokenizer (re-encoding decoded text picks the
canonical merges, not the ones the model sampled); a char-level toy hides them. Training here keeps
tests free of downloads, and byte-level pre-tokenization means any bytes round-trip.
"""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]

_SHELL = [
    "ls -la /workspace", "cat /etc/os-release", "grep -rn 'TODO' src/ | head -20",
    "find . -name '*.py' -type f | xargs wc -l", "cd /tmp && mkdir -p build && cd build",
    "python3 -m pytest -q tests/", "pip install -r requirements.txt", "echo $HOME > out.txt",
    "sed -i 's/foo/bar/g' config.yaml", "awk '{print $1}' access.log | sort | uniq -c",
    "tar -xzf archive.tar.gz -C /opt", "chmod +x run.sh && ./run.sh", "git status && git diff",
    "cp -r data/ backup/", "rm -rf /tmp/cache", "head -n 5 /var/log/syslog", "wc -c < file.bin",
]
_JSON = [
    '{"name": "bash", "arguments": {"command": "ls -la"}}',
    '{"name": "bash", "arguments": {"command": "cat README.md"}}',
    '{"name": "bash", "arguments": {"command": "python3 solve.py --input data.csv"}}',
    '{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}',
]
_ENGLISH = [
    "You are a helpful assistant that solves tasks in a Linux terminal.",
    "Write a script that counts the lines in every Python file and prints the total.",
    "Fix the failing test in the repository and make sure all tests pass.",
    "The file contains a list of names; sort them and remove duplicates.",
    "Create a directory called output and save the results there.",
    "Command finished with exit code 0. No such file or directory.",
    "Permission denied. Traceback (most recent call last): Error: invalid value",
]


def default_corpus() -> list[str]:
    """The built-in training text: shell, paths, tool-call JSON, English, and chat glue."""
    glue = [f"<tool_call>\n{j}\n</tool_call>" for j in _JSON]
    return (_SHELL + _JSON + _ENGLISH + glue) * 4


def train_tokenizer(vocab_size: int = 512, corpus: list[str] | None = None) -> Tokenizer:
    """Train a byte-level BPE tokenizer; the same inputs give the same vocabulary and merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus if corpus is not None else default_corpus(), trainer=trainer)
    return tok


def load_or_train(path: str, vocab_size: int = 512) -> Tokenizer:
    """Load tokenizer.json at path, or train one and save it there."""
    if os.path.exists(path):
        return Tokenizer.from_file(path)
    tok = train_tokenizer(vocab_size)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tok.save(path)
    return tok


def token_id(tok: Tokenizer, token: str) -> int:
    """The id of a special token; a missing one is a configuration error, so it raises."""
    tid = tok.token_to_id(token)
    if tid is None:
        raise KeyError(f"token {token!r} is not in the vocabulary")
    return tid
