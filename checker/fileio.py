"""Atomic file writes: readers see the old file or the new one, never a part. Every report,
counterexample, policy and plot batchcheck writes goes through ``write_atomic``."""

from __future__ import annotations

import hashlib
import os
import re
import socket
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


# The temporary file of a write: ``.NAME.bcPID-HOST.XXXXXXXX.tmp`` (the writer's pid and a tag of its host, then
# mkstemp's random part), so that a later run can tell its own writer's leftovers from anyone's live file.
_TEMPORARY = re.compile(r"^\..+\.bc(?P<pid>[0-9]+)-(?P<host>[0-9a-f]{8})\.[a-z0-9_]{8}\.tmp$")
_CLEANED: set[str] = set()  # folders this process has cleaned


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _writer() -> str:
    return f"bc{os.getpid()}-{_host()}"


def clean_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporary files that batchcheck's own atomic writes left in ``folder`` when their process was
    killed (SIGKILL, a power cut: no chance to remove them): only names ``write_atomic`` makes, only of writers
    on this host that are no longer running. Once per folder and process (the first write there); the files
    removed. Anything else (a live writer's file, another host's, a file of another program) is left alone."""
    key = str(Path(folder).resolve())
    if key in _CLEANED:
        return []
    _CLEANED.add(key)
    removed = []
    host = _host()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        m = _TEMPORARY.match(name)
        if m is None or m["host"] != host or int(m["pid"]) == os.getpid() or _running(int(m["pid"])):
            continue
        try:
            os.unlink(Path(folder) / name)
            removed.append(Path(folder) / name)
        except OSError:  # gone already (another run cleaning), or not ours to remove
            pass
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's live process (or no such pid at all: leave it)
        return True
    return True


def write_atomic(path: str | Path, data: str | bytes, *, create_dirs: bool = False, flag: str = "--out") -> None:
    """Write ``data`` to ``path``: a temporary file in the same directory, flushed and synced, then
    renamed over the target (keeping the target's permissions); the first write into a directory removes
    the temporary files killed writers left there (``clean_stale_temporaries``). ``create_dirs`` makes missing parent
    directories; otherwise a missing or unwritable directory is an input error naming ``flag``."""
    target = Path(path)
    if target.is_dir():
        raise InputError(Problem(flag, str(path), "a file path, not a directory"))
    try:
        if create_dirs:
            target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(target.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{_writer()}.", suffix=".tmp", dir=target.parent)
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
