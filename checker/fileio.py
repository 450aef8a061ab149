"""Atomic file writes: readers see the old file or the new one, never a part. Every report,
counterexample, policy and plot batchcheck writes goes through ``write_atomic``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from checker.errors import InputError, Problem

MAX_NAME = 120  # characters of one name in a file name (a file name has at most 255 bytes)


def safe_name(name: str | None, default: str = "unnamed") -> str:
    """A name (a policy's, a property's, an invariant's) as one part of a file name: letters, digits, ``-``
    and ``_`` kept, anything else (``/``, ``.``, ``\\``, spaces, control characters) ``_``, at most MAX_NAME
    characters. Every name that becomes part of a file name goes through it, so no name can lead a file out
    of the folder it is written to (``../../x`` becomes ``______x``)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in (name or default))
    return safe[:MAX_NAME]


def write_atomic(path: str | Path, data: str | bytes, *, create_dirs: bool = False, flag: str = "--out") -> None:
    """Write ``data`` to ``path``: a temporary file in the same directory, flushed and synced, then
    renamed over the target (keeping the target's permissions). ``create_dirs`` makes missing parent
    directories; otherwise a missing or unwritable directory is an input error naming ``flag``."""
    target = Path(path)
    if target.is_dir():
        raise InputError(Problem(flag, str(path), "a file path, not a directory"))
    try:
        if create_dirs:
            target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:  # a parent that is a file (/dev/null/x), unwritable, missing without create_dirs
        reason = "a file on the way is not a directory" if isinstance(exc, (FileExistsError, NotADirectoryError)) \
            else exc.strerror
        raise InputError(Problem(flag, str(path), f"a file in an existing, writable directory ({reason})")) \
            from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        if target.exists():
            mode = target.stat().st_mode & 0o777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise InputError(Problem(flag, str(path), f"a writable file path ({exc.strerror})")) from None
        raise
