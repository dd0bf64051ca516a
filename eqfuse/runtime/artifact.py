"""One-file artifacts: a compiled Module saved with everything it runs on, loaded without the compiler.

`Module.save(path, targets=None)` writes, and `load(path)` (`eqfuse.load`) reads back:

- the shared library of every compiled binding, once per target: an x86-64 level
  (eqfuse.machine.LEVELS), built with `-march=<level>` so that it runs on every CPU of that level
  (the Module's own libraries are built with -march=native, which may use extensions other CPUs
  of its level lack); the default target is this machine's level;
- the bound weights as raw arrays, and each GEMM's prepacked panels of them per target (the
  panels follow the plan, which follows the vector width), each stored once by content;
- the graphs (as written and optimized), their dims and batch buckets, every kernel plan and
  memory plan (pickled: the artifact is read only by the eqfuse version that wrote it), the
  precision, the report;
- a manifest (JSON) with eqfuse's version and the sha256 and size of every part.

The file: a header (MAGIC, the format number, the manifest's length and its sha256), the
manifest, then the parts, each at a 64-byte aligned offset from the data start (a page boundary),
so that a memory-mapped array starts on a cache line, as the kernels' packed weights expect.

Loading reads the manifest and checks it against its digest and the file's size, the versions
and this CPU's level, then checks the digests of the pickled plans and of the one target's
libraries it uses. A library is extracted into the kernel cache under its digest (dlopen needs a
file; the cache's ownership rule and a digest check before loading, as for compiled kernels).
The weights and panels are memory-mapped, read-only, and checked by size (the file's); their
digests only with verify=True (reading BERT-base's 800 MB takes longer than the rest of the load).
A file mapping is in 4 KiB pages: the few-rows GEMMs' panels (a decoder's weight stream) of 1 MiB
or more are copied into transparent huge pages at their first use (eqfuse.runtime.program.
skinny_panels), as a compiled Module packs them.
Nothing here imports the frontend, the optimizer or a C compiler.

A pickled Module is its artifact's bytes (`dumps`, `loads`): loaded from bytes, the parts are
copied once into an aligned buffer instead of mapped.

The pickled parts run code when loaded, as the libraries do: load only artifacts you trust.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.machinery
import io
import json
import mmap
import os
import pickle
import platform
import struct
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

# the kernel kinds' plan details, which the pickled plans hold: imported with eqfuse, not at
# the first load
from eqfuse.backend import kinds  # noqa: F401
from eqfuse.backend.cbuild import load_library
from eqfuse.backend.plan import precision_entries
from eqfuse.cache import owned_privately, usable_cache_dir
from eqfuse.errors import EqfuseError
from eqfuse.machine import (
    EXTENSION_FLAGS,
    LEVELS,
    host_isa,
    level_rank,
    machine,
    pinned,
    usable_level,
)
from eqfuse.runtime.buckets import Bucketed
from eqfuse.runtime.module import Compiled, GraphFunction, Module
from eqfuse.runtime.padded import PaddedFunction
from eqfuse.runtime.program import HugeCopies
from eqfuse.version import __version__

MAGIC = b"EQFUSE\x00A"
# 2: a decoder's steps keyed (dims, live dim, pick): its prompt chunks compute one row of logits
FORMAT = 2
HEADER = struct.Struct("<8sIQ32s")  # magic, format, manifest length, sha256 of the manifest
PAGE = 4096  # the data start: a page boundary, so that the mapped parts keep their alignment
ALIGN = 64  # every part starts on a cache line
SUFFIX = ".eqf"


class ArtifactError(EqfuseError):
    """An artifact that cannot be saved or loaded here (exit status 2 on the command line)."""


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _extension_suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


# ---------------------------------------------------------------- save


class _Parts:
    """The parts of an artifact being written, each stored once by content."""

    def __init__(self):
        self.data: dict[str, object] = {}  # name -> bytes or a contiguous array
        self.entries: dict[str, dict] = {}
        self._by_digest: dict[tuple[str, str], str] = {}

    def add(self, prefix: str, value, **info) -> str:
        """The name of the part holding `value`; an array's `info` (its dtype and shape) is part of
        what makes it the same part: equal bytes of another dtype or shape (a zero bias of 128
        floats, the 64 zero integers of a mask) are another part, read as themselves."""
        buf = value if isinstance(value, bytes) else np.ascontiguousarray(value)
        digest = hashlib.sha256(buf if isinstance(buf, bytes) else buf.reshape(-1).view(np.uint8)).hexdigest()
        ident = hashlib.sha256(f"{digest} {sorted(info.items())}".encode()).hexdigest() if info else digest
        key = (prefix, ident)
        if key in self._by_digest:
            return self._by_digest[key]
        name = f"{prefix}/{ident[:24]}"
        self._by_digest[key] = name
        self.data[name] = buf
        nbytes = len(buf) if isinstance(buf, bytes) else buf.nbytes
        self.entries[name] = {"sha256": digest, "size": nbytes, **info}
        return name

    def add_array(self, prefix: str, a: np.ndarray) -> str:
        a = np.ascontiguousarray(a)
        return self.add(prefix, a, dtype=a.dtype.str, shape=list(a.shape))


def _check_targets(targets) -> list[str]:
    """The levels to build for: each a known level this CPU runs (the packed weights are made by
    the target's own code), default this machine's."""
    here = usable_level()
    if targets is None:
        if here is None:
            raise ArtifactError("this CPU is below x86-64-v2, the lowest level an artifact is built for")
        return [here]
    if isinstance(targets, str):
        targets = [t for t in targets.split(",") if t]
    targets = list(dict.fromkeys(targets))
    if not targets:
        raise ArtifactError("targets= names no level (known: " + ", ".join(LEVELS) + ")")
    for t in targets:
        if t not in LEVELS:
            raise ArtifactError(f"unknown target '{t}' (known: {', '.join(LEVELS)})")
        if level_rank(t) > level_rank(here):
            raise ArtifactError(f"cannot build for {t} on this machine, which runs up to {here}: an artifact's "
                                "weights are packed by its target's own code, so each target must run where it is saved")
    return targets


def _savable(f) -> None:
    """Refuse a function the artifact cannot hold, with what to do instead."""
    if isinstance(f, PaddedFunction):
        if not f.modules and not f.live_modules:  # (eqfuse.generate compiles only its chunk and decode steps)
            raise ArtifactError(f"graph {f.name} is not compiled yet ({', '.join(f.padded)} bound per call): call it "
                                "once before saving (its buckets are compiled at the first call)")
        for m in list(f.modules.values()) + list(f.live_modules.values()):
            for g in m.functions.values():
                _savable(g)
        return
    if not isinstance(f, GraphFunction):
        raise ArtifactError(f"graph {f.name}: a {type(f).__name__} cannot be saved yet (grad= with unbound dims): "
                            "compile it with dims= binding them")
    if not f.cache and not f.buckets:
        unbound = [d for d in f.source.dims() if d not in f.dims]
        raise ArtifactError(f"graph {f.name} is not compiled yet ({', '.join(unbound)} unbound): compile it with "
                            "dims= (or buckets=) or call it once before saving")


def _function_meta(f, parts: _Parts) -> dict:
    """What a function is, apart from its compiled code: its graphs, dims, buckets and weights."""
    if isinstance(f, PaddedFunction):
        return {"kind": "padded", "name": f.name, "inputs": f.inputs, "batch": f.batch_dim, "padded": f.padded,
                "sizes": f.sizes, "padding": f.padding, "limits": f.limits, "out_axes": f.out_axes,
                "per_value": sorted(f.per_value),
                "modules": {key: [_function_meta(g, parts) for g in m.functions.values()]
                            for key, m in f.modules.items()},
                # a decoder's step over its cache in place (live_module): its dims and live dim
                "live": {key: [_function_meta(g, parts) for g in m.functions.values()]
                         for key, m in f.live_modules.items()},
                "last": next((key for key, m in f.modules.items() if m is f.last_module), None)}
    return {"kind": "graph", "name": f.name, "source": f.source, "optimized": f.optimized, "dims": dict(f.dims),
            "verify": f.verify, "threads": f.threads,
            "batch": (f.batch_dim, f.bucket_sizes) if f.batch_dim is not None else None,
            "params": {n: parts.add_array("weight", a) for n, a in f.params.items()},
            "last": _last_key(f)}


def _bindings(f) -> list[dict]:
    """The dims bindings a function holds compiled (for the manifest and the refusal of others)."""
    if isinstance(f, PaddedFunction):  # each bucket's padded dims, with the dims its graphs bind
        out = []
        buckets = [(dict(zip(f.padded, key)), m) for key, m in f.modules.items()]
        for fixed, m in buckets + [(dict(key[0]), m) for key, m in f.live_modules.items()]:
            inner = [b for g in m.functions.values() for b in _bindings(g)] or [{}]
            out += [b for b in ({**fixed, **b} for b in inner) if b not in out]
        return out
    return [dict(k) for k in list(f.cache) + list(f.buckets)]


def _compiled_state(c: Compiled, f: GraphFunction, parts: _Parts, libs: dict, target: str) -> dict:
    """What a loader needs to make this Compiled again: its plans, its library's part and its panels."""
    lib = None
    if c.library is not None:
        path = Path(c.library)
        if path not in libs:
            name = path.name[: -len(_extension_suffix())] if path.name.endswith(_extension_suffix()) else path.stem
            libs[path] = (parts.add(f"lib/{target}", path.read_bytes()), name)
        lib = libs[path]
    # the panels of every bound weight a GEMM prepacks, made now by this target's code
    names = [n for n, _ in f.optimized.params]
    c.runner.warm([f.params.get(n) for n in names])
    panels = {s: parts.add_array(f"panel/{target}", P) for s, P in c.runner.packed().items()}
    return {"graph": c.graph, "kgraph": c.kgraph, "plans": c.plans, "memory": c.memory, "kernels": c.kernels,
            "alias": dict(c.alias), "library": lib, "panels": panels}


def _function_state(f, parts: _Parts, libs: dict, target: str) -> dict:
    """A function's bindings and buckets built again for the machine model in force."""
    if isinstance(f, PaddedFunction):
        return {kind: {key: {g.name: _function_state(g, parts, libs, target) for g in m.functions.values()}
                       for key, m in modules.items()}
                for kind, modules in (("modules", f.modules), ("live", f.live_modules))}
    cache, buckets = f.rebuilt()
    return {"compiled": [(key, _compiled_state(c, f, parts, libs, target)) for key, c in cache.items()],
            "buckets": [(key, {s: _compiled_state(c, f, parts, libs, target) for s, c in built.items()},
                         dict(f.buckets[key].cost)) for key, built in buckets.items()]}


def target_extensions(target: str, precision: str) -> list[str]:
    """The ISA extensions beyond the level `target` that its code uses: a bf16 model's GEMMs take
    the AVX512_BF16 path (vdpbf16ps), and its blocked GEMMs the AMX-BF16 one (tdpbf16ps), as the
    compiled Module's do (its outputs, bit for bit), where this machine has them and the level is
    AVX-512; nothing else does. The artifact then runs only on a CPU with them (`_choose_target`)."""
    m = machine()
    if precision != "bf16" or not m.avx512_bf16 or LEVELS[target][1] < 16:
        return []
    return ["avx512_bf16"] + (["amx_bf16"] if m.amx_bf16 else [])


def _target_state(fns: list, parts: _Parts, target: str, extensions: list[str]) -> dict:
    """Every function's bindings and buckets built for `target` (an x86-64 level) and `extensions`."""
    libs: dict = {}
    lanes = LEVELS[target][1]
    isa = {k: k in extensions for k in EXTENSION_FLAGS}
    with pinned(replace(machine(), simd_floats=lanes, target=target, **isa), clamp=False):
        return {f.name: _function_state(f, parts, libs, target) for f in fns}


def _write(module: Module, out, targets) -> None:
    """The artifact of `module`, written to the binary file object `out`."""
    targets = _check_targets(targets)
    fns = list(module.functions.values())
    for f in fns:
        _savable(f)
    parts = _Parts()
    functions = [_function_meta(f, parts) for f in fns]
    extensions = {t: target_extensions(t, module.precision) for t in targets}
    per_target = {t: _target_state(fns, parts, t, extensions[t]) for t in targets}
    try:
        report = pickle.dumps(module.report)
    except Exception:  # a report holding something that does not pickle: kept as text
        report = pickle.dumps(repr(module.report))
    common = {"functions": functions, "report": report, "graph_text": module.graph, "precision": module.precision}
    # one pickle per target, with the common part in it: the graphs a target's plans share with
    # the functions are then read once
    target_meta = {t: parts.add(f"meta/{t}", pickle.dumps((common, s), protocol=pickle.HIGHEST_PROTOCOL))
                   for t, s in per_target.items()}
    offset = 0
    for name, e in parts.entries.items():
        e["offset"] = offset = _pad(offset, ALIGN)
        offset += e["size"]
    manifest = {
        "format": FORMAT, "eqfuse": __version__, "python": sys.implementation.cache_tag,
        "extension": _extension_suffix(), "machine": platform.machine(), "precision": module.precision,
        "targets": {t: {"meta": target_meta[t], "extensions": extensions[t]} for t in targets},
        "graphs": {f.name: f"{f.name}({', '.join(f.free)})" for f in fns},
        "dims": {f.name: _bindings(f) for f in fns},
        "buckets": {f.name: [b.sizes for b in f.buckets.values()] if isinstance(f, GraphFunction) and f.batch_dim
                    else None for f in fns},
        "padded": {f.name: f.sizes for f in fns if isinstance(f, PaddedFunction)},
        "data": offset, "parts": parts.entries,
    }
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    start = _pad(HEADER.size + len(text), PAGE)
    manifest["size"] = start + offset
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    start = _pad(HEADER.size + len(text), PAGE)
    if manifest["size"] != start + offset:  # the size's own digits moved the data start
        manifest["size"] = start + offset
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        assert _pad(HEADER.size + len(text), PAGE) == start
    out.write(HEADER.pack(MAGIC, FORMAT, len(text), hashlib.sha256(text).digest()))
    out.write(text)
    pos = HEADER.size + len(text)
    for name, e in parts.entries.items():
        at = start + e["offset"]
        out.write(b"\0" * (at - pos))
        buf = parts.data[name]
        out.write(buf if isinstance(buf, bytes) else memoryview(buf.reshape(-1).view(np.uint8)))
        pos = at + e["size"]
    out.write(b"\0" * (start + offset - pos))


def _last_key(f: GraphFunction):
    """Which binding or bucket set the function's last call ran (its `kernels` show it)."""
    for key, c in f.cache.items():
        if c is f.last:
            return ("compiled", key)
    for key, b in f.buckets.items():
        if f.last in b.compiled.values():
            return ("buckets", key, next(s for s, c in b.compiled.items() if c is f.last))
    return None


def save(module: Module, path, targets=None) -> Path:
    """Module.save: the artifact written to a temporary file beside `path`, then renamed onto it,
    so that `path` is never half-written."""
    path = Path(path)
    if path.is_dir():
        raise ArtifactError(f"{path}: is a directory (give the artifact's file name, e.g. model{SUFFIX})")
    if not path.parent.is_dir():
        raise ArtifactError(f"{path}: no such directory {path.parent}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise ArtifactError(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as out:
            _write(module, out, targets)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise ArtifactError(f"{path}: cannot write ({e.strerror or e})") from None
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def dumps(module: Module) -> bytes:
    """The artifact's bytes (a pickled Module): the bytes it was loaded from, else written now
    for this machine's level (and remembered while the Module compiles nothing new)."""
    if isinstance(module.artifact, bytes):
        return module.artifact
    if isinstance(module.artifact, Path):
        try:
            return module.artifact.read_bytes()
        except OSError:
            pass  # (moved away since: written again below)
    key = tuple((f.name, tuple(getattr(f, "cache", ())), tuple(getattr(f, "buckets", ()))) for f in
                module.functions.values())
    memo = module.__dict__.get("_artifact_bytes")
    if memo is not None and memo[0] == key:
        return memo[1]
    out = io.BytesIO()
    _write(module, out, None)
    module.__dict__["_artifact_bytes"] = (key, out.getvalue())
    return out.getvalue()


# ---------------------------------------------------------------- load


def load(path, verify: bool = False) -> Module:
    """The Module saved at `path` (eqfuse.load). verify=True also checks every weight's digest."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < HEADER.size:
                raise ArtifactError(f"{path}: not an eqfuse artifact (too short: {size} bytes)")
            head = fh.read(HEADER.size)
            _check_magic(path, head)
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except IsADirectoryError:
        raise ArtifactError(f"{path}: is a directory, not an artifact") from None
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    m = _open(memoryview(buf), str(path), verify)
    m.artifact = path.resolve()
    return m


def loads(data: bytes, verify: bool = False) -> Module:
    """The Module of an artifact's bytes (how a pickled Module unpickles)."""
    if len(data) < HEADER.size:
        raise ArtifactError("not an eqfuse artifact (too short)")
    _check_magic("the pickled Module", bytes(data[:HEADER.size]))
    # one copy into a buffer that starts on a page, so that the parts keep their alignment
    raw = np.empty(len(data) + PAGE, dtype=np.uint8)
    shift = -raw.ctypes.data % PAGE
    buf = raw[shift:shift + len(data)]
    buf[:] = np.frombuffer(data, dtype=np.uint8)
    buf.flags.writeable = False
    m = _open(memoryview(buf), "the pickled Module", verify)
    m.artifact = bytes(data)
    return m


def _check_magic(where, head: bytes) -> None:
    if head[:8] != MAGIC:
        raise ArtifactError(f"{where}: not an eqfuse artifact (write one with Module.save or `eqfuse compile -o`)")


def _digest(view) -> str:
    return hashlib.sha256(view).hexdigest()


def _open(buf: memoryview, where: str, verify: bool) -> Module:
    magic, fmt, length, digest = HEADER.unpack(buf[:HEADER.size])
    damaged = f"{where}: the artifact is damaged or was changed after it was saved"
    if fmt != FORMAT:
        raise ArtifactError(f"{where}: artifact format {fmt}; this eqfuse ({__version__}) reads format {FORMAT}: "
                            "save the model again with this version")
    text = bytes(buf[HEADER.size:HEADER.size + length])
    if len(text) != length or hashlib.sha256(text).digest() != digest:
        raise ArtifactError(f"{damaged} (its manifest does not match its digest)")
    try:
        man = json.loads(text)
    except ValueError:
        raise ArtifactError(f"{damaged} (its manifest is not JSON)") from None
    if man.get("eqfuse") != __version__:
        raise ArtifactError(f"{where}: saved by eqfuse {man.get('eqfuse')}; this is eqfuse {__version__}: "
                            "compile and save the model again with this version")
    if man.get("python") != sys.implementation.cache_tag or man.get("extension") != _extension_suffix():
        raise ArtifactError(f"{where}: its libraries are built for Python {man.get('python')} "
                            f"({man.get('extension')}); this is {sys.implementation.cache_tag} ({_extension_suffix()}): "
                            "save the model again with this Python")
    if man.get("machine") != platform.machine():
        raise ArtifactError(f"{where}: built for {man.get('machine')}, this machine is {platform.machine()}")
    if len(buf) != man["size"]:
        raise ArtifactError(f"{damaged} (it has {len(buf)} bytes, {man['size']} when saved"
                            + (": truncated)" if len(buf) < man["size"] else ")"))
    target = _choose_target(man, where)
    start = _pad(HEADER.size + length, PAGE)
    parts = man["parts"]

    def part(name: str, check: bool) -> memoryview:
        e = parts[name]
        view = buf[start + e["offset"]:start + e["offset"] + e["size"]]
        if check and _digest(view) != e["sha256"]:
            raise ArtifactError(f"{damaged} (part {name} does not match its digest)")
        return view

    common, state = _unpickle(part(man["targets"][target]["meta"], True))
    arrays: dict[str, np.ndarray] = {}

    def array(name: str) -> np.ndarray:
        if name not in arrays:
            e = parts[name]
            a = np.frombuffer(part(name, verify), dtype=np.dtype(e["dtype"])).reshape(e["shape"])
            arrays[name] = a
        return arrays[name]

    libs: dict[str, object] = {}
    huge = HugeCopies()  # the skinny GEMMs' panels in huge pages, copied at their first use (one copy each)

    def library(ref):
        name, module_name = ref
        if name not in libs:
            libs[name] = (_extract(module_name, part(name, True), parts[name]["sha256"]))
        return libs[name]

    def function(fm: dict, fs: dict):
        if fm["kind"] == "padded":
            def modules(kind):
                return {key: Module([function(gm, fs[kind][key][gm["name"]]) for gm in sub], {}, str,
                                    common["precision"]) for key, sub in fm.get(kind, {}).items()}
            pf = PaddedFunction.restored(fm["name"], fm["inputs"], fm["batch"], fm["padded"], fm["sizes"],
                                         fm["padding"], fm["limits"], fm["out_axes"], modules("modules"), fm["last"],
                                         _no_compiler(fm["name"], where, man["dims"][fm["name"]]))
            pf.live_modules = modules("live")
            pf.per_value = {tuple(k) for k in fm.get("per_value", [])}
            return pf
        f = GraphFunction(fm["source"], fm["optimized"], {n: array(p) for n, p in fm["params"].items()}, fm["dims"],
                          _no_compiler(fm["name"], where, man["dims"].get(fm["name"], [])), fm["verify"],
                          fm["threads"], fm["batch"])

        def compiled(st):
            plans.extend(st["plans"])
            mod, path = library(st["library"]) if st["library"] else (None, None)
            c = Compiled(st["graph"], st["kgraph"], st["plans"], mod and mod.lib, mod and mod.ffi, st["kernels"],
                         st["memory"], None, st["alias"], path)
            names = [n for n, _ in f.optimized.params]
            for s, pname in st["panels"].items():
                pos = dict(st["memory"].prepacks)[s]
                c.runner.adopt_packed(s, f.params[names[pos]], array(pname), huge)
            return c

        for key, st in fs["compiled"]:
            f.cache[key] = compiled(st)
            f.note_bf16_caches(f.cache[key])
        for key, sts, cost in fs["buckets"]:
            f.buckets[key] = Bucketed(f.batch_dim, f.optimized, {s: compiled(st) for s, st in sts.items()}, cost)
            for c in f.buckets[key].compiled.values():
                f.note_bf16_caches(c)
        last = fm["last"]
        if last is not None:
            f.last = f.cache[last[1]] if last[0] == "compiled" else f.buckets[last[1]].compiled[last[2]]
        return f

    plans: list = []  # every plan of this target, as `compiled` meets them
    functions = [function(fm, state[fm["name"]]) for fm in common["functions"]]
    text = common["graph_text"]
    report = pickle.loads(common["report"])
    _precision_of(report, precision_entries(plans))
    module = Module(functions, report, lambda: text, common["precision"])
    module.target = target
    return module


def _precision_of(report, entries: dict) -> None:
    """The report's precision entries (report["precision"], or each graph's for several graphs)
    made those of the target loaded: its instruction paths may differ from the saving machine's
    (a bf16 GEMM of an x86-64-v3 target has no AVX512_BF16 path)."""
    if not isinstance(report, dict):
        return
    for r in [report] + list(report.values()):
        if isinstance(r, dict) and isinstance(r.get("precision"), dict):
            prec = r["precision"]
            prec.update({k: entries[k] for k in prec if k in entries})


def _unpickle(blob):
    """The pickled parts, read with the cyclic garbage collector paused: unpickling a large
    model's plans makes a few hundred thousand objects, which would trigger collections that
    find nothing to free."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(blob)
    finally:
        if paused:
            gc.enable()


def _choose_target(man: dict, where: str) -> str:
    """The highest of the artifact's levels that this CPU (as the machine model sees it) runs,
    with the ISA extensions beyond it that the target's code uses."""
    here = usable_level()
    m, host = machine(), host_isa()
    missing = {t: [x for x in e.get("extensions", []) if not (getattr(m, x, False) and host.get(x))]
               for t, e in man["targets"].items()}
    levels = [t for t in man["targets"] if t in LEVELS and level_rank(t) <= level_rank(here)]
    fits = [t for t in levels if not missing[t]]
    if not fits:
        have = ", ".join(t + "".join(f"+{x}" for x in e.get("extensions", [])) for t, e in man["targets"].items())
        if levels:
            lacks = sorted({x for t in levels for x in missing[t]})
            raise ArtifactError(f"{where}: built for {have}; this CPU lacks {', '.join(lacks)} (save the model "
                                f"on a machine without it, or with targets= including a level below {levels[-1]})")
        raise ArtifactError(f"{where}: built for {have}; this CPU runs up to {here or 'below x86-64-v2'} "
                            f"(save the model with targets= including {here or 'a level it has'})")
    return max(fits, key=level_rank)


def _no_compiler(name: str, where: str, bindings: list[dict]):
    """A loaded function's build: a binding the artifact does not hold needs the compiler."""
    held = "; ".join(", ".join(f"{k}={v}" for k, v in b.items()) or "no dims" for b in bindings)

    def build(g, binds=(), names=None, panels=None, **_):
        if isinstance(g, dict):  # a padded function's new bucket (or decode step: live=)
            binds = [g]
        want = "; ".join(", ".join(f"{k}={v}" for k, v in b.items()) for b in binds)
        raise ArtifactError(f"graph {name}: {where} holds it compiled at {held}; a call at {want} needs the compiler: "
                            "compile the model with these dims (or buckets=) and save it again")
    return build


def _extract(module_name: str, data: memoryview, digest: str):
    """(the imported library, its file): the file in the kernel cache named by its digest, written
    (then renamed into place) unless an intact copy is there."""
    if module_name in sys.modules:  # loaded already in this process (the same build: its name is its key)
        mod = sys.modules[module_name]
        return mod, Path(getattr(mod, "__file__", "") or module_name)
    root = usable_cache_dir()
    final = root / f"{module_name}.{digest[:32]}{_extension_suffix()}"
    if not _intact(final, digest):
        fd, tmp = tempfile.mkstemp(prefix=f"{module_name}.", suffix=".tmp", dir=root)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(tmp, 0o644)  # whatever the umask: nobody else may change what is loaded
            os.replace(tmp, final)  # atomic: a reader sees no library or the whole library
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return load_library(module_name, final), final


def _intact(path: Path, digest: str) -> bool:
    try:
        return owned_privately(path) and hashlib.sha256(path.read_bytes()).hexdigest() == digest
    except OSError:
        return False


def artifact_info(path) -> dict:
    """The manifest of an artifact (for `eqfuse run` and tests), checked against its digest."""
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(HEADER.size)
        _check_magic(path, head)
        _, _, length, digest = HEADER.unpack(head)
        text = fh.read(length)
    if hashlib.sha256(text).digest() != digest:
        raise ArtifactError(f"{path}: the artifact is damaged or was changed after it was saved")
    return json.loads(text)


Module.artifacts = sys.modules[__name__]
