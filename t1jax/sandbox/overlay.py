"""A container's changes read from its overlayfs layers on disk, as `docker diff` lists them.

Why: the verifier's tamper check diffs every agent sandbox, and the daemon's diff costs ~0.6
CPU-seconds per call on the images here (it compares whole trees; BENCHMARKS.md, "Sandbox
diff"), where the writable layer holds only the few paths the agent touched. Only a local
daemon's layers are readable (as root); `changes` returns None wherever this reading cannot be
exact (unreadable layers or xattrs, renamed directories, metadata-only copies), and the caller
asks the daemon instead.

overlayfs marks a deleted path with a whiteout (a 0:0 character device) and a directory whose
lower contents are hidden with the xattr trusted.overlay.opaque=y. Like `docker diff`: a deleted
directory is one D (its contents are not listed), an added one lists every path inside as A, and
a directory is C when its mode or owner changed or anything inside it did.
"""

from __future__ import annotations

import errno
import os
import stat

_OPAQUE, _REDIRECT, _METACOPY = ("trusted.overlay.opaque", "trusted.overlay.redirect",
                                 "trusted.overlay.metacopy")


class _Unreadable(Exception):
    """The layers hold something this reading does not model: ask the daemon."""


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError as err:
        if err.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise _Unreadable(f"{path}: {err}") from err


def _whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


class _Image:
    """The lower layers (top first) as one tree: what a path is in the image, if anything."""

    def __init__(self, lowers: list[str]):
        self.lowers = lowers
        self._memo: dict[str, os.stat_result | None] = {}

    def stat(self, rel: str) -> os.stat_result | None:
        """The image's `rel` (no leading /), or None where no layer has it or a whiteout, a file
        or an opaque directory in a higher layer hides it."""
        if rel not in self._memo:
            self._memo[rel] = self._lookup(rel)
        return self._memo[rel]

    def _lookup(self, rel: str) -> os.stat_result | None:
        parent, _, _ = rel.rpartition("/")
        if parent and not (self.stat(parent) and stat.S_ISDIR(self.stat(parent).st_mode)):
            return None
        for lower in self.lowers:
            path = os.path.join(lower, rel)
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                st = None
            if st is not None:
                return None if _whiteout(st) else st
            if parent and self._opaque_in(lower, parent):
                return None  # this layer's directory hides the lower ones' contents
        return None

    def _opaque_in(self, lower: str, rel_dir: str) -> bool:
        path = os.path.join(lower, rel_dir)
        return os.path.isdir(path) and not os.path.islink(path) and _xattr(path, _OPAQUE) == b"y"

    def children(self, rel_dir: str) -> set[str]:
        """The names directly inside the image's directory `rel_dir`."""
        names: set[str] = set()
        for lower in self.lowers:
            path = os.path.join(lower, rel_dir)
            if not os.path.isdir(path) or os.path.islink(path):
                if os.path.lexists(path):
                    break  # a file or whiteout in this layer hides the lower directories
                continue
            names.update(os.listdir(path))
            if _xattr(path, _OPAQUE) == b"y":
                break
        return {n for n in names if self.stat(f"{rel_dir}/{n}" if rel_dir else n) is not None}


def changes(upper: str, lowers: list[str]) -> list[tuple[str, str]] | None:
    """(kind, path) for what the writable layer `upper` added (A), changed (C) or deleted (D)
    against the image `lowers` (top first), sorted by path; None where this reading cannot be
    exact."""
    image = _Image(lowers)
    kinds: dict[str, str] = {}
    quiet_dirs: set[str] = set()  # in the image and unchanged themselves: C only via contents
    try:
        for root, dirs, files in os.walk(upper):
            for name in dirs + files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, upper)
                st = os.lstat(path)
                if _whiteout(st):
                    kinds[rel] = "D"
                    continue
                if _xattr(path, _METACOPY) is not None or (
                        stat.S_ISDIR(st.st_mode) and _xattr(path, _REDIRECT) is not None):
                    return None
                before = image.stat(rel)
                if before is None:
                    kinds[rel] = "A"
                elif not (stat.S_ISDIR(st.st_mode) and stat.S_ISDIR(before.st_mode)):
                    kinds[rel] = "C"
                elif (st.st_mode, st.st_uid, st.st_gid) != (before.st_mode, before.st_uid,
                                                            before.st_gid):
                    kinds[rel] = "C"
                else:
                    quiet_dirs.add(rel)
                if stat.S_ISDIR(st.st_mode) and before is not None and _xattr(path, _OPAQUE) == b"y":
                    for name_below in image.children(rel) - set(os.listdir(path)):
                        kinds[f"{rel}/{name_below}"] = "D"
    except _Unreadable:
        return None
    for rel in list(kinds):  # a change inside makes each enclosing directory a change
        parent = rel.rpartition("/")[0]
        while parent and parent in quiet_dirs:
            quiet_dirs.discard(parent)
            kinds[parent] = "C"
            parent = parent.rpartition("/")[0]
    return sorted(((kind, "/" + rel) for rel, kind in kinds.items()), key=lambda c: c[1])
