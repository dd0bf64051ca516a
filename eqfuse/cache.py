"""eqfuse's cache directory and the rule every file in it follows.

Compiled kernels, the soundness verdicts of rule files and this machine's measured speed are
kept under one directory ($EQFUSE_CACHE_DIR, else $XDG_CACHE_HOME/eqfuse, else ~/.cache/eqfuse).
Anything read back from it is trusted only when the directory is this user's and no one else
can write to it (`usable_cache_dir`); otherwise this process uses a private temporary directory.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
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


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """eqfuse's version and every source file of the package, read once per process: part of
    the key of every entry that holds pickled eqfuse objects (an optimized graph, an imported
    model), so that an edited checkout never reads an entry another one wrote."""
    import hashlib

    from eqfuse.version import __version__

    h = hashlib.sha256(__version__.encode() + b"\0")
    package = Path(__file__).parent
    for f in sorted(package.rglob("*")):
        if f.suffix in (".py", ".rw", ".lark") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(package)).encode() + b"\0")
            try:
                h.update(f.read_bytes())
            except OSError:
                pass
    return h.hexdigest()


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


def _write_atomically(path: Path, chunks) -> bool:
    """Write chunks to path through a temporary file in the same directory and a rename: a reader
    sees the old file or the new one, never half of one. False when it cannot be written."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                for c in chunks:
                    f.write(c)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True
    except OSError:
        return False


def write_entry(path: Path, payload: bytes) -> bool:
    """Store payload at path, atomically (`_write_atomically`), with its sha256 in front so that
    `read_entry` can tell a damaged file. False when the cache cannot be written (not an error:
    the next run computes it again)."""
    import hashlib

    return _write_atomically(path, [_MAGIC, hashlib.sha256(payload).hexdigest().encode(), b"\n", payload])


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


# ---------------------------------------------------------------- mapped files: big arrays, read in place

# Big arrays (an imported model's weights, the kernels' packed panels of them) are stored raw and
# memory-mapped read-only: a warm compile copies none of them. Such a file is named by a digest of
# what it holds and checked by its size and the ownership rule, not by a digest of its bytes
# (hashing 340 MB costs what the mapping saves), as an artifact's weights are (runtime.artifact).

_ORIGINS: dict[int, tuple] = {}  # id(array) -> (a weak reference to it, where its bytes come from)


def note_origin(a, origin: str) -> None:
    """Record that array a holds, read-only, the bytes that `origin` names (a mapped file's name,
    an offset and a length): whatever is computed from a alone can be kept under that name. The
    file's name up to its first '-' names the entry it belongs to: files kept of it are named
    with that prefix, and go when the entry is replaced (eqfuse.frontend.onnx_cache)."""
    import weakref

    k = id(a)
    _ORIGINS[k] = (weakref.ref(a, lambda _: _ORIGINS.pop(k, None)), origin)


def origin_of(a) -> str | None:
    """What `note_origin` recorded for a, or None."""
    got = _ORIGINS.get(id(a))
    return got[1] if got is not None and got[0]() is a else None


def read_mapped(path: Path, nbytes: int):
    """The file at path memory-mapped read-only (a buffer), when it is nbytes long and owned by
    this user alone; else None."""
    import mmap

    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size != nbytes or nbytes == 0 or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def write_mapped(path: Path, buffers) -> bool:
    """Store the buffers' bytes at path, atomically, for `read_mapped`."""
    return _write_atomically(path, buffers)


# ---------------------------------------------------------------- eqfuse cache info | clear

def _entries(root: Path) -> dict[str, list[Path]]:
    """The cache's files by kind: compiled kernels (with their digests and locks), optimized graphs,
    imported ONNX models (eqfuse.frontend.onnx_cache: an entry and its weights file)."""
    out: dict[str, list[Path]] = {"kernels": [], "graphs": [], "imports": []}
    if not root.is_dir():
        return out
    for f in root.iterdir():
        if f.is_file() and f.name.startswith("_eqf_"):
            out["kernels"].append(f)
    for kind in ("graphs", "imports"):
        if (root / kind).is_dir():
            out[kind] = [f for f in (root / kind).iterdir() if f.is_file()]
    return out


def info() -> dict:
    """{"dir": the cache directory, "kernels"/"graphs"/"imports": {"entries": n, "bytes": b}}."""
    root = cache_dir()
    out: dict = {"dir": str(root)}
    for kind, files in _entries(root).items():
        # (an optimized graph's pickle is a second form of its entry, and a memo a fact derived
        # from one, an imported model's weights, their packed panels and its header and an import's
        # DimsNeeded parts of its entry: not entries; their bytes count)
        n = sum(1 for f in files if f.suffix not in (".sha256", ".lock", ".pickle", ".memo", ".weights", ".panels", ".header", ".needs")
                and not f.name.startswith(".tmp-"))
        size = 0
        for f in files:
            with contextlib.suppress(OSError):
                size += f.stat().st_size
        out[kind] = {"entries": n, "bytes": size}
    return out


def clear() -> dict:
    """Remove every compiled kernel, optimized graph and imported model of the cache directory (only when it is
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
