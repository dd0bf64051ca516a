"""The import cache: an ONNX file imported once is not parsed again.

A warm compile of BERT-base spent most of its time reading the 340 MB protobuf and turning its
initializers into arrays, before any stage of its own. `import_path(path, dims)` keeps what
`onnx_import.import_model` made of the file, beside the kernel cache (`<cache dir>/imports/`):

- `<key>.entry`: the imported graph, the runtime inputs' and outputs' ONNX names, each weight's
  name, dtype, shape, weights file and offset, the identity of the ONNX file and of the weights files, pickled,
  written whole and read back only when its digest matches (eqfuse.cache.write_entry / read_entry);
- `<key>-<digest>.weights`: every weight, raw, each at a 64-byte aligned offset, memory-mapped
  read-only on a hit: a warm import reads no weight until a kernel does, and copies none. A weight
  equal to one this process wrote for an import of the same file at other dims is not written
  again: the entry names that import's file (a decoder's two steps, a padded model's buckets);
- `<key>.needs`: an import that stopped with DimsNeeded (the model imports only with some of its
  named dims bound: a decoder's concat along its past), raised again from here, by the same rule;
- `<key>.header`: what the stages read before an import (`header`: the graph's name, its inputs,
  their named dims, the tables the inputs index), by the same rule; kept in the process too, so a
  decoder compiled at several dims parses its file for them once.

The key is the file's real path and the dims bound at import; the entry holds the digest of
eqfuse's sources (eqfuse.cache.code_digest: the pickle's classes are the ones that wrote it) and is
replaced, with its weights and panels, when it differs, so a model has one entry whatever version
of eqfuse ran last. The value is served only while the file is the one that was imported. **The rule**, as git's index applies it: the
file's identity is its device, inode, size, mtime and ctime, in nanoseconds. Any write to the file
changes its mtime and ctime; `touch -d` or `os.utime` can put the mtime back but sets the ctime to
now, which no unprivileged call can set back; replacing the file (a new export renamed over it)
changes the inode. Timestamps advance in ticks of the kernel's clock (milliseconds, seconds on some
file systems), so a file changed within the tick in which it was stat'ed could keep its identity:
an entry whose file was modified less than `RACY_SECONDS` before the entry was written is *racy*,
and each hit on a racy entry reads the file again and compares its sha256 with the one of the
bytes that were imported (and, once the file is older than that, writes the entry as not racy).
So a big file is never hashed on a warm compile, and a changed file is never served.

A model whose weights are in external data files (`onnx.save(..., save_as_external_data=True)`,
as large exports are written) is cached the same way: the entry also records each data file's real
path, identity and sha256 (the `location` of its tensors, beside the model), and is served only
while every one of them is the file that was imported, by the same rule (a racy data file is
hashed again at each hit); the weights come from the cache's own mapped file, not the data files.

The weights file is checked by its own identity (inode, size, mtime, ctime, recorded when it was
written) and the cache's ownership rule (eqfuse.cache.owned_privately); its content digest is in
its name but not recomputed on a hit (reading 340 MB to hash it costs what the cache saves), as
the weights of an artifact are not (eqfuse.runtime.artifact).

Not cached: a model given as bytes or a ModelProto, `values=` (the onnx backend's fixed inputs), a
model whose external data cannot be read (its own message), an import that fails. EQFUSE_NO_CACHE=1
(`--no-cache`) neither reads nor writes entries; `eqfuse cache info|clear` counts and removes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from eqfuse.errors import DimsNeeded
from eqfuse.frontend.onnx_inputs import Header, Imported, load_model

SUBDIR = "imports"
ENABLED = True  # False turns the cache off in this process (the test suite does, but in its cache tests)
RACY_SECONDS = 2.0  # a file modified this close to its entry's writing is checked by its content
ALIGN = 64
FORMAT = 1


def enabled() -> bool:
    from eqfuse.cache import no_cache

    return ENABLED and not no_cache()


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _racy(st: os.stat_result, now_ns: int) -> bool:
    return max(st.st_mtime_ns, st.st_ctime_ns) >= now_ns - int(RACY_SECONDS * 1e9)


def _key(path: Path, dims: Mapping[str, int] | None, whole_windows: bool = False) -> str:
    """The entry's name: the file's path and the dims. eqfuse's sources are checked inside the
    entry instead (`_entry`), so that a new eqfuse (or an edited checkout) replaces a model's entry,
    its weights and their panels, rather than leaving them beside a new one."""
    h = hashlib.sha256(b"eqfuse onnx import\0")
    h.update(f"{FORMAT}\0{path}\0".encode())
    h.update(repr(sorted((dims or {}).items())).encode())
    if whole_windows:
        h.update(b"\0whole windows")
    return h.hexdigest()


def _dir() -> Path | None:
    from eqfuse.cache import usable_cache_dir

    try:
        return usable_cache_dir() / SUBDIR
    except OSError:
        return None


def import_path(path: str | os.PathLike, dims: Mapping[str, int] | None = None, whole_windows: bool = False) -> Imported:
    """onnx_import.import_model(path, dims=dims, whole_windows=...), from the cache when the file
    is the one it holds."""
    if not enabled():
        from eqfuse.frontend.onnx_import import import_model

        return import_model(path, dims=dims, whole_windows=whole_windows)
    real = Path(os.path.realpath(path))
    root = _dir()
    key = _key(real, dims, whole_windows)
    got = _get(root, key, real) if root is not None else None
    if got is not None:
        return got
    needs = _needs(root / f"{key}.needs", real) if root is not None else None
    if needs is not None:
        raise needs
    from eqfuse.frontend.onnx_import import import_model

    if root is None:
        return import_model(path, dims=dims, whole_windows=whole_windows)
    try:
        before = os.stat(real)
        shared = _shared(real, before)
        data = shared[0] if shared else real.read_bytes()
    except OSError:
        return import_model(path, dims=dims, whole_windows=whole_windows)  # its own message
    if shared:
        proto, external = shared[1:]
    else:
        proto = load_model(data, where=str(path))
        external = _external_files(proto, real.parent)
        _share(real, before, data, proto, external)
    if (real, _identity(before)) not in _HEADERS:
        with contextlib.suppress(Exception):  # (a by-product: the import gives its own message)
            _keep_header(root, real, before, data, proto)
    try:
        ext = [(f, os.stat(f), _file_digest(f)) for f in external]
    except OSError:
        return import_model(path, dims=dims, whole_windows=whole_windows)  # (onnx's message for the missing or unreadable file)
    if external:
        try:
            from onnx.external_data_helper import load_external_data_for_model

            load_external_data_for_model(proto, str(real.parent))
        except Exception:  # (onnx refuses a location outside the model's directory, a short file, ...)
            return import_model(path, dims=dims, whole_windows=whole_windows)  # its own message
    try:
        imp = import_model(proto, dims=dims, whole_windows=whole_windows)
    except DimsNeeded as e:
        # kept as an import is: a decoder's export is imported at no dims first, to learn that it
        # needs them bound (a concat along its past), and a warm compile need not parse it for that
        with contextlib.suppress(OSError, pickle.PicklingError):
            if _unchanged(real, before, ext):
                from eqfuse.cache import write_entry

                write_entry(root / f"{key}.needs", pickle.dumps(
                    {**_stamp(before, _content_digest(real, before, data), ext),
                     "needs": (e.message, e.pos, e.hint, tuple(e.sums))}, protocol=pickle.HIGHEST_PROTOCOL))
        raise
    with contextlib.suppress(OSError):
        if _unchanged(real, before, ext):  # not changed while read
            if _put(root, key, real, before, _content_digest(real, before, data), imp, ext):
                # the weights as a warm compile maps them: this process's memory holds no copy,
                # and the kernels' panels of them are kept too (runtime.program)
                del data, proto
                imp = _get(root, key, real) or imp
    return imp


# A file's parse kept for its next imports while `sharing_parses()` is active: eqfuse.generate's
# first compile imports a decoder export three times (at no dims, which learns that the past must
# be bound, then its chunk and decode steps), and a parse reads and decodes the whole file, most
# of a cold import of a large export. Kept with the external data files it names, read before
# their data was loaded into it, so a later import's entry records them too. Dropped when the
# outermost `sharing_parses` exits: an import's parse is held, at most, until the compiles that
# asked for it are done.
_PARSES: dict[tuple, tuple[bytes, object, list[Path]]] = {}  # (real path, identity) -> (bytes, proto, external)
_SHARING = [0]  # active sharing_parses() contexts, in any thread
_PARSES_LOCK = threading.Lock()


@contextlib.contextmanager
def sharing_parses():
    """Within it, the imports of one file at several dims parse it once (eqfuse.generate's first compile)."""
    with _PARSES_LOCK:
        _SHARING[0] += 1
    try:
        yield
    finally:
        with _PARSES_LOCK:
            _SHARING[0] -= 1
            if not _SHARING[0]:
                _PARSES.clear()


def _shared(real: Path, st: os.stat_result):
    with _PARSES_LOCK:
        return _PARSES.get((real, _identity(st)))


def _share(real: Path, st: os.stat_result, data: bytes, proto, external: list[Path]) -> None:
    with _PARSES_LOCK:
        if _SHARING[0]:
            _PARSES[(real, _identity(st))] = (data, proto, external)


def _unchanged(real: Path, before: os.stat_result, ext) -> bool:
    """The file and its external data files are as they were stat'ed before being read."""
    return _identity(os.stat(real)) == _identity(before) and all(
        _identity(os.stat(f)) == _identity(st) for f, st, _ in ext)


def _needs(at: Path, real: Path) -> DimsNeeded | None:
    """The DimsNeeded an import of the file as it is now raised at these dims, kept at `at`."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError,
                             AttributeError):
        e = _entry(at, real)
        if e is not None:
            message, pos, hint, sums = e["needs"]
            err = DimsNeeded(message, pos, hint)
            err.sums = tuple(sums)
            return err
    return None


def _tensors(graph):
    """Every TensorProto of an ONNX graph: initializers and tensor attributes, subgraphs' too."""
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for g in a.graphs:
                yield from _tensors(g)


def _external_files(proto, base: Path) -> list[Path]:
    """The real paths of the files holding some tensor's data (read by onnx beside the model's),
    in order of first use; none for a model that holds its weights."""
    from onnx.external_data_helper import uses_external_data

    out: dict[Path, None] = {}
    for t in _tensors(proto.graph):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            out.setdefault(Path(os.path.realpath(base / loc)), None)
    return list(out)


_DIGESTS: dict[tuple, str] = {}  # (real path, identity) -> the sha256 of its bytes, in this process


def _content_digest(real: Path, st: os.stat_result, data: bytes) -> str:
    """The sha256 of `data`, the bytes of `real` read after `st` was taken; hashed once per file in a
    process (a decoder's header and its imports at two dims each hashed the whole file), unless racy."""
    key = (real, _identity(st))
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = hashlib.sha256(data).hexdigest()
    if not _racy(st, time.time_ns()):
        _DIGESTS[key] = digest
    return digest


def _file_digest(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks (an external data file can be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def _entry(path: Path, real: Path) -> dict | None:
    """The entry at path when it is of the file as it is now (the module's rule), else None."""
    from eqfuse.cache import read_entry, write_entry

    payload = read_entry(path)
    if payload is None:
        return None
    from eqfuse.cache import code_digest

    e = pickle.loads(payload)
    st = os.stat(real)
    if e["format"] != FORMAT or e["code"] != code_digest() or _identity(st) != e["file"]:
        return None
    now = time.time_ns()
    if e["racy"]:
        if hashlib.sha256(real.read_bytes()).hexdigest() != e["sha256"]:
            return None
    external = []
    for x in e.get("external", ()):  # the external data files, each by the same rule
        xst = os.stat(x["path"])
        if _identity(xst) != x["file"] or (x["racy"] and _file_digest(Path(x["path"])) != x["sha256"]):
            return None
        external.append({**x, "racy": x["racy"] and _racy(xst, now)})
    was = (e["racy"], [x["racy"] for x in e.get("external", ())])
    e = {**e, "racy": e["racy"] and _racy(st, now), "external": external}
    if (e["racy"], [x["racy"] for x in external]) != was:  # verified, and old enough now: no more hashing
        write_entry(path, pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL))
    return e


def _stamp(st: os.stat_result, digest: str, external=()) -> dict:
    """What an entry records of the file it was made from (read after `st` was taken), and of
    its external data files: (real path, stat, sha256) each."""
    from eqfuse.cache import code_digest

    now = time.time_ns()
    return {"format": FORMAT, "code": code_digest(), "file": _identity(st), "racy": _racy(st, now), "sha256": digest,
            "external": [{"path": str(f), "file": _identity(xst), "racy": _racy(xst, now), "sha256": d}
                         for f, xst, d in external]}


_HEADERS: dict[tuple, Header] = {}  # (real path, identity) -> its header, in this process


def header(model) -> Header:
    """onnx_inputs.header(model), read once per file: kept in this process, and beside the imports
    (by the module's rule, with the digest of eqfuse's sources), so that the stages asking a model's
    inputs, dims and name before its import (a decoder compiled per bucket asks them at each
    bucket) parse it once, and a model served by the cache is not parsed at all. A file modified
    within RACY_SECONDS is read again at each call. A model given as bytes or a ModelProto is read
    as it is."""
    from eqfuse.frontend import onnx_inputs

    if not isinstance(model, (str, os.PathLike)):
        return onnx_inputs.header(model)
    real = Path(os.path.realpath(model))
    try:
        st = os.stat(real)
    except OSError:
        return onnx_inputs.header(model)  # its own message
    held = _HEADERS.get((real, _identity(st)))
    if held is not None:
        return held
    root = _dir() if enabled() else None
    at = _header_at(root, real) if root is not None else None
    if at is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError,
                                 AttributeError):
            e = _entry(at, real)
            if e is not None and isinstance(e.get("header"), Header):
                return _hold(real, st, e["header"])
    try:
        data = real.read_bytes()
    except OSError:
        return onnx_inputs.header(model)  # its own message
    return _keep_header(root, real, st, data, load_model(data, where=str(model)))


def _header_at(root: Path, real: Path) -> Path:
    """Where the header of the file at `real` is kept under `root`."""
    return root / f"{_key(real, {'(header)': 0})}.header"


def _keep_header(root: Path | None, real: Path, st: os.stat_result, data: bytes, proto) -> Header:
    """The header of `proto`, parsed from `data`, the bytes of `real` read after `st` was taken,
    kept (in the process, and under `root` when there is one) if the file did not change meanwhile;
    an import keeps it too, so that the stages asking after it do not parse the file again."""
    from eqfuse.frontend import onnx_inputs

    out = onnx_inputs.header(proto)
    with contextlib.suppress(OSError):
        if _identity(os.stat(real)) == _identity(st):  # not changed while read
            if root is not None:
                from eqfuse.cache import write_entry

                write_entry(_header_at(root, real),
                            pickle.dumps({**_stamp(st, _content_digest(real, st, data)), "header": out}))
            _hold(real, st, out)
    return out


def _hold(real: Path, st: os.stat_result, h: Header) -> Header:
    if not _racy(st, time.time_ns()):
        _HEADERS[(real, _identity(st))] = h
    return h


def input_dims(path: str | os.PathLike) -> list[str]:
    """onnx_inputs.input_dims(path), from the file's header: checking dims= against a model served
    by the cache parses nothing."""
    return list(header(path).dims)


def _get(root: Path, key: str, real: Path) -> Imported | None:
    from eqfuse.cache import note_origin, read_mapped

    try:
        e = _entry(root / f"{key}.entry", real)
        if e is None:
            return None
        maps = []
        for name, identity in e["blobs"]:
            blob = root / name
            if _identity(os.stat(blob)) != identity:
                return None
            mm = read_mapped(blob, identity[2])  # (the ownership rule)
            if mm is None:
                return None
            maps.append((name, mm))
        params = {}
        for name, dtype, shape, j, offset in e["params"]:
            blob, mm = maps[j]
            dt = np.dtype(dtype)
            a = np.frombuffer(mm, dtype=dt, count=int(np.prod(shape, dtype=np.int64)), offset=offset).reshape(shape)
            note_origin(a, f"{blob}:{offset}:{a.nbytes}:{dtype}:{shape}")  # (runtime.program's panels)
            params[name] = a
        return Imported(e["graph"], params, e["inputs"], e["outputs"])
    except (OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, AttributeError, EOFError):
        return None


# (cache directory, real path, its identity, the weights' name digest) -> the weights files this
# process wrote of that file: [(file, its identity, its mapping, {(name, dtype, shape): offset})].
# The imports of one file at other dims (a decoder's chunk and decode steps, a padded model's
# buckets) hold mostly the same weights (each binding folds a few constants of its own), which
# _put writes once.
_WRITTEN: dict[tuple, list[tuple[Path, tuple, object, dict]]] = {}
_WRITING = threading.Lock()  # (one _put at a time: of two imports at once, the second finds the first's)


def _written_equal(held: list, name: str, a: np.ndarray, mine: Path) -> tuple[Path, tuple, int] | None:
    """(file, identity, offset) of an array equal to `a` under its name among the files `held`
    that are still the ones written, but `mine` (the file about to be written again)."""
    key = (name, a.dtype.str, tuple(int(d) for d in a.shape))
    for blob, identity, mm, arrays in held:
        offset = arrays.get(key)
        if offset is None or blob == mine:
            continue
        with contextlib.suppress(OSError):
            if _identity(os.stat(blob)) == identity and np.array_equal(
                    np.frombuffer(mm, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape), a):
                return blob, identity, offset
    return None


def _put(root: Path, key: str, real: Path, st: os.stat_result, digest: str, imp: Imported, external=()) -> bool:
    """Write the weights file, then the entry that names it (a reader finds the old entry and its
    file, or the new ones). Other weights files of the key (an older version of the model) go.
    `external`: the model's data files, (real path, stat, sha256) each, read after the stat.

    A weight equal (name, dtype, shape and every element) to one of the same file that this process
    wrote for another import (at other dims) is not written again: the entry names that file and
    its offset. The reader checks each file's identity, so an entry one of whose files was replaced
    or removed is not served (the model is imported again)."""
    from eqfuse.cache import read_mapped, write_entry, write_mapped

    named = hashlib.sha256("\0".join([digest, *(d for _, _, d in external)]).encode()).hexdigest() if external \
        else digest  # (the weights' name follows the data files' content too)
    blob = root / f"{key}-{named[:24]}.weights"
    written = (root, real, _identity(st), named)
    try:
        with _WRITING:
            held = _WRITTEN.setdefault(written, [])
            files: list[tuple[str, tuple]] = []  # the entry's weights files: (name, identity)
            table, own, offset = [], [], 0  # (name, dtype, shape, file, offset); the arrays written here
            for name, a in imp.params.items():
                shape = tuple(int(d) for d in a.shape)
                found = _written_equal(held, name, a, blob) if a.nbytes >= ALIGN else None
                if found is not None:
                    if (found[0].name, found[1]) not in files:
                        files.append((found[0].name, found[1]))
                    table.append((name, a.dtype.str, shape, files.index((found[0].name, found[1])), found[2]))
                    continue
                offset += -offset % ALIGN
                table.append((name, a.dtype.str, shape, None, offset))
                own.append((offset, a))
                offset += a.nbytes

            def chunks():
                at = 0
                for at_, a in own:
                    yield b"\0" * (at_ - at)
                    yield np.ascontiguousarray(a).reshape(-1).view(np.uint8).data
                    at = at_ + a.nbytes

            if own:
                if not write_mapped(blob, chunks()):
                    return False
                identity = _identity(os.stat(blob))
                mm = read_mapped(blob, identity[2])
                if mm is not None:
                    held.append((blob, identity, mm, {(n, dt, sh): o for n, dt, sh, j, o in table if j is None}))
                files.append((blob.name, identity))
                table = [(n, dt, sh, len(files) - 1 if j is None else j, o) for n, dt, sh, j, o in table]
            for old in [*root.glob(f"{key}-*.weights"), *root.glob(f"{key}-*.panels")]:
                if old != blob or not own:  # (an older file or eqfuse's: their panels with them)
                    with contextlib.suppress(OSError):
                        old.unlink()
        entry = {**_stamp(st, digest, external), "graph": imp.graph, "inputs": imp.inputs, "outputs": imp.outputs,
                 "params": table, "blobs": files}
        return write_entry(root / f"{key}.entry", pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))
    except (OSError, pickle.PicklingError):
        return False
