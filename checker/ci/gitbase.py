"""``batchcheck ci --base REF``: the policy files changed since a git ref, and their text at that ref.

What a pull request changed is ``git diff REF`` (the working tree against REF: commits and uncommitted edits
alike) and the files git does not track yet. A file's version at REF is ``git show REF:PATH``. Paths are the repository's; ci compares them as
absolute paths with the config's files.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from checker.errors import InputError, Problem


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise InputError(Problem("--base", args[-1], "a git ref, with git installed (git was not found)")) from None


def toplevel(root: Path, base: str) -> Path:
    proc = _git(root, "rev-parse", "--show-toplevel")
    if proc.returncode:
        raise InputError(Problem("--base", base, f"a git ref of the repository that holds the config ({root} is "
                                 "not in a git repository)"))
    return Path(proc.stdout.strip())


def changed_files(root: Path, base: str) -> set[Path]:
    """The files that differ between REF and the working tree (added, modified, renamed), absolute."""
    top = toplevel(root, base)
    check = _git(top, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    if check.returncode:
        raise InputError(Problem("--base", base, "a git ref of this repository (a branch, tag or commit; in a CI "
                                 "checkout fetch the base branch first, e.g. fetch-depth: 0)"))
    proc = _git(top, "diff", "--name-only", "--diff-filter=AMR", base, "--")
    if proc.returncode:
        raise InputError(Problem("--base", base, f"a ref git can diff against ({proc.stderr.strip()})"))
    new = _git(top, "ls-files", "--others", "--exclude-standard")  # not yet added: changed too
    names = proc.stdout.splitlines() + (new.stdout.splitlines() if new.returncode == 0 else [])
    return {(top / line).resolve() for line in names if line}


def text_at(root: Path, base: str, path: Path) -> str | None:
    """The file's text at REF, or None when it did not exist there (a new policy: nothing to compare)."""
    top = toplevel(root, base)
    rel = path.resolve().relative_to(top).as_posix()
    proc = _git(top, "show", f"{base}:{rel}")
    return proc.stdout if proc.returncode == 0 else None
