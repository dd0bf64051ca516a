"""eqfuse's cache directory and the rule every file in it follows.

Compiled kernels, the soundness verdicts of rule files and this machine's measured speed are
kept under one directory ($EQFUSE_CACHE_DIR, else $XDG_CACHE_HOME/eqfuse, else ~/.cache/eqfuse).
Anything read back from it is trusted only when the directory is this user's and no one else
can write to it (`usable_cache_dir`); otherwise this process uses a private temporary directory.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path


class CacheWarning(UserWarning):
    """The kernel cache directory cannot be used safely: a private temporary one is used instead."""


def cache_dir() -> Path:
    env = os.environ.get("EQFUSE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "eqfuse"


_FALLBACK: list[Path] = []  # this process's temporary cache, made at the first need


def usable_cache_dir() -> Path:
    """cache_dir(), created 0700 if missing, when it is safe to load libraries from: a directory
    of this user that no one else can write to (else another user could plant a library under
    a predictable name). Otherwise, or when it cannot be created, a private temporary directory
    for this process, with a warning."""
    root = cache_dir()
    try:
        try:
            root.mkdir(mode=0o700, parents=True)
            os.chmod(root, 0o700)  # whatever the umask
        except FileExistsError:
            pass
        st = root.stat()
        problem = ("not a directory" if not stat.S_ISDIR(st.st_mode)
                   else "owned by another user" if st.st_uid != os.getuid()
                   else "writable by other users" if st.st_mode & 0o022
                   else "not writable" if not os.access(root, os.W_OK | os.X_OK) else None)
    except OSError as e:
        problem = f"cannot be created ({e.strerror or e})"
    if problem is None:
        return root
    if not _FALLBACK:
        _FALLBACK.append(Path(tempfile.mkdtemp(prefix="eqfuse-cache-")))
        atexit.register(shutil.rmtree, _FALLBACK[0], True)
    warnings.warn(f"the kernel cache {root} is {problem}; using {_FALLBACK[0]} for this process "
                  "(set EQFUSE_CACHE_DIR to a directory of your own)", CacheWarning, stacklevel=3)
    return _FALLBACK[0]


def owned_privately(path: Path) -> bool:
    """Owned by this user and writable by no one else."""
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022

