"""eqfuse's cache directory and the rule every file in it follows.

Compiled kernels, the soundness verdicts of rule files and this machine's measured speed are
kept under one directory ($EQFUSE_CACHE_DIR, else $XDG_CACHE_HOME/eqfuse, else ~/.cache/eqfuse).
Anything read back from it is trusted only when the directory is this user's and no one else
can write to it (`usable_cache_dir`); otherwise this process uses a private temporary directory.
"""

from __future__ import annotations

import atexit
import contextlib
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


def no_cache() -> bool:
    """EQFUSE_NO_CACHE=1 (what `--no-cache` sets): compiled kernels and optimized graphs are
    neither read from nor kept in the cache directory (kernels are built in a private temporary
    directory). What only saves work and cannot change a result stays in use: parsed rule files,
    parser tables, soundness verdicts, the measured machine speed."""
    return os.environ.get("EQFUSE_NO_CACHE", "") not in ("", "0")


def private_dir() -> Path:
    """This process's own temporary directory (removed at exit)."""
    if not _FALLBACK:
        _FALLBACK.append(Path(tempfile.mkdtemp(prefix="eqfuse-cache-")))
        atexit.register(shutil.rmtree, _FALLBACK[0], True)
    return _FALLBACK[0]


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
    private_dir()
    warnings.warn(f"the kernel cache {root} is {problem}; using {_FALLBACK[0]} for this process "
                  "(set EQFUSE_CACHE_DIR to a directory of your own)", CacheWarning, stacklevel=3)
    return _FALLBACK[0]


def owned_privately(path: Path) -> bool:
    """Owned by this user and writable by no one else."""
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022



# ---------------------------------------------------------------- entries: written whole, read verified

_MAGIC = b"eqfuse-cache-entry 1\n"


def write_entry(path: Path, payload: bytes) -> bool:
    """Store payload at path, atomically (a temporary file in the same directory, then rename: a
    reader sees the old entry or the new one, never half of one), with its sha256 in front so that
    `read_entry` can tell a damaged file. False when the cache cannot be written (not an error:
    the next run computes it again)."""
    import hashlib

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True
    except OSError:
        return False


def read_entry(path: Path) -> bytes | None:
    """The payload `write_entry` stored at path, or None: missing, unreadable, or its digest does
    not match (a damaged entry is removed)."""
    import hashlib

    try:
        data = path.read_bytes()
    except OSError:
        return None
    head, _, rest = data.partition(b"\n")
    digest, _, payload = rest.partition(b"\n")
    if head + b"\n" != _MAGIC or hashlib.sha256(payload).hexdigest().encode() != digest:
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return payload


# ---------------------------------------------------------------- eqfuse cache info | clear

def _entries(root: Path) -> dict[str, list[Path]]:
    """The cache's files by kind: compiled kernels (with their digests and locks), optimized graphs."""
    out: dict[str, list[Path]] = {"kernels": [], "graphs": []}
    if not root.is_dir():
        return out
    for f in root.iterdir():
        if f.is_file() and f.name.startswith("_eqf_"):
            out["kernels"].append(f)
    graphs = root / "graphs"
    if graphs.is_dir():
        out["graphs"] = [f for f in graphs.iterdir() if f.is_file()]
    return out


def info() -> dict:
    """{"dir": the cache directory, "kernels"/"graphs": {"entries": n, "bytes": b}}."""
    root = cache_dir()
    out: dict = {"dir": str(root)}
    for kind, files in _entries(root).items():
        # (an optimized graph's pickle is a second form of its entry, and a memo a fact derived
        # from one: not entries; their bytes count)
        n = sum(1 for f in files if f.suffix not in (".sha256", ".lock", ".pickle", ".memo")
                and not f.name.startswith(".tmp-"))
        size = 0
        for f in files:
            with contextlib.suppress(OSError):
                size += f.stat().st_size
        out[kind] = {"entries": n, "bytes": size}
    return out


def clear() -> dict:
    """Remove every compiled kernel and optimized graph of the cache directory (only when it is
    this user's own: usable_cache_dir); what info() counted before."""
    before = info()
    root = cache_dir()
    if not root.is_dir() or not owned_privately(root):
        return before
    for files in _entries(root).values():
        for f in files:
            with contextlib.suppress(OSError):
                f.unlink()
    for d in root.glob("_eqf_*"):  # a killed build's temporary directory
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
    return before
