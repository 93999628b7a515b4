"""Bounded capture of a command's output, and one consistent way to clean it for a model.

A model sees at most `cap` bytes of any command's output: the head and the tail, with a marker in
between saying how much was cut (Terminus-2 keeps 10 KB the same way). Memory stays bounded however
much the command prints.
"""

from __future__ import annotations

import re

_ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


class HeadTailBuffer:
    """Keeps the first and last `cap // 2` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.cap = max(int(cap), 2)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap // 2 - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            keep = self.cap - self.cap // 2
            if len(self._tail) > 2 * keep:  # amortised trimming
                del self._tail[:-keep]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def getvalue(self) -> bytes:
        keep = self.cap - self.cap // 2
        if not self.truncated:
            return bytes(self._head + self._tail)
        tail = bytes(self._tail[-keep:])
        omitted = self.total - len(self._head) - len(tail)
        marker = f"\n[... output truncated: {omitted} bytes omitted ...]\n".encode()
        return bytes(self._head) + marker + tail


def strip_ansi(text: str) -> str:
    """Text without terminal escape sequences (colours, cursor moves, titles)."""
    return _ANSI.sub(b"", text.encode("utf-8", "surrogateescape")).decode("utf-8",
                                                                          "surrogateescape")


def clean_output(data: bytes) -> str:
    """Bytes -> text a model can read: invalid UTF-8 replaced, ANSI escapes removed, CRLF -> LF,
    and a line redrawn with bare carriage returns (progress bars) keeps only its last state."""
    data = _ANSI.sub(b"", data).replace(b"\r\n", b"\n")
    text = data.decode("utf-8", errors="replace")
    if "\r" in text:
        text = "\n".join(_last_redraw(line) for line in text.split("\n"))
    return text


def _last_redraw(line: str) -> str:
    parts = [p for p in line.split("\r")]
    # a trailing '\r' (cursor back, nothing written) leaves the previous state visible
    while len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts[-1]
