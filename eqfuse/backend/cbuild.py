"""Stage: C source -> loaded extension module, through cffi's API mode, cached on disk.

The cache key is a hash of the source, the cdef, the compiler's version and the flags, so a
second compile of the same model never runs the C compiler. Builds are safe when several
processes compile at once (a per-key file lock) and when a process is killed mid-compile
(each build happens in a private temporary directory and is renamed into place at the end,
so a half-written library is never visible under its final name). The sha256 of each library
is stored beside it and checked before it is loaded: a damaged entry is rebuilt.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import cffi

from eqfuse.cache import no_cache, owned_privately, private_dir, usable_cache_dir
from eqfuse.errors import EqfuseError
from eqfuse.machine import host_openmp_spin_count

# No -ffast-math: it lets gcc assume no NaN/inf (breaking relu/max of NaN) and reassociate
# freely. -fno-math-errno lets sqrtf/fmaxf become instructions; -fno-trapping-math lets gcc
# if-convert and vectorize conditional code; neither changes a result. gnu11 for _Thread_local
# and restrict.
# The -march flags come from the machine model (eqfuse.machine), see compiler_flags.
# -Wno-aggressive-loop-optimizations: gcc 12 reports "iteration N invokes undefined behavior" for a
# scalar tail loop that starts where a vector loop stopped, in constant-propagated clones whose trip
# count it cannot bound (a bf16 GEMM's packing of one 64-wide panel, a layernorm's row on AVX-512):
# an overflow at an iteration the loop never reaches, which -Werror turned into a failed build
FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wno-aggressive-loop-optimizations",
         "-std=gnu11")
LINK_FLAGS = ("-fopenmp",)
# No debug info: Python's own CFLAGS, which setuptools puts first, carry -g (pyenv's and most
# distributions' builds), and nothing reads a kernel's debug info, while it cost a fifth to a
# third of gcc's time on a large module (a BERT layer's, a block of row kernels).
# EQFUSE_CFLAGS=-g and the sanitizers' flags come after, and bring it back.
# (Not in FLAGS: those go into an exported library's Makefile, after the user's CFLAGS.)
NO_DEBUG = ("-g0",)

# Every generated module exports these, so the Module can set the OpenMP thread count; a graph's
# module also shares the process's scratch-buffer key (eqfuse.runtime.program.share_scratch_key).
# eqf_team_tids(n, out) writes the thread ids (gettid) of the OpenMP team of n threads that
# the calling thread gets, its own first, and returns the team's size: the runtime tells these
# from the other threads of the process (eqfuse.runtime.load). The num_threads clause leaves the
# thread count that torch reads as it is.
COMMON_C = """
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* before the first system header: sched_getcpu, CPU_SET (common_pool.h) */
#endif
#include <omp.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
void eqf_set_threads(int n) { if (n > 0) omp_set_num_threads(n); }
int eqf_get_threads(void) { return omp_get_max_threads(); }
int eqf_team_tids(int n, long* out)
{
    int size = 1;
#pragma omp parallel num_threads(n)
    {
#if defined(__linux__)
        out[omp_get_thread_num()] = (long)syscall(SYS_gettid);
#else
        out[omp_get_thread_num()] = 0;
#endif
#pragma omp single
        size = omp_get_num_threads();
    }
    return size;
}
"""
COMMON_CDEF = "void eqf_set_threads(int n);\nint eqf_get_threads(void);\nint eqf_team_tids(int n, long* out);"
# A graph's library also exports these, from csrc_templates/runtime.c (its scratch key, which the
# Python runtime shares among the libraries of the process, and its pool workers' thread ids).
HEADER_CDEF = "long eqf_scratch_key_get(void);\nvoid eqf_scratch_key_adopt(long key);\nconst int* eqf_pool_tids(void);"


class CompileError(EqfuseError):
    """The C compiler refused generated code: an eqfuse bug, reported with the compiler's words."""

    exit_status = 3


@dataclass(frozen=True)
class Built:
    ffi: object
    lib: object
    path: Path
    cached: bool  # True when loaded from the cache without running the compiler


def compiler() -> str:
    """The C compiler setuptools runs: $CC, else the one Python was built with."""
    return os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"


def compiler_version(cc: str | None = None) -> str:
    """The compiler's command, the path it resolves to and its version line."""
    return _compiler_version(cc or compiler())


@functools.lru_cache(maxsize=None)
def _compiler_version(cc: str) -> str:
    exe = shutil.which(cc.split()[0]) if cc.split() else None
    path = os.path.realpath(exe) if exe else "?"
    try:
        out = subprocess.run(cc.split() + ["--version"], capture_output=True, text=True, timeout=30)
        return f"{cc} {path} " + (out.stdout.splitlines()[0] if out.stdout else "")
    except (OSError, subprocess.SubprocessError):
        return f"{cc} {path}"


@functools.lru_cache(maxsize=None)
def target_isa(cc: str, flags: tuple[str, ...]) -> str:
    """What the target flags mean on this host: -march=native names a different instruction set
    on each CPU, so the compiler's own expansion of it (gcc's and clang's cc1 command line, with
    every -m feature spelled out) goes into the cache key."""
    try:
        out = subprocess.run(cc.split() + list(flags) + ["-E", "-v", "-"], input="", capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return " ".join(flags)
    return "\n".join(ln.strip() for ln in out.stderr.splitlines() if "cc1" in ln) or " ".join(flags)


SANITIZERS = ("address", "undefined")


def sanitizers() -> tuple[str, ...]:
    """EQFUSE_SANITIZE=address,undefined (either or both): kernels built with those sanitizers."""
    names = tuple(n.strip() for n in os.environ.get("EQFUSE_SANITIZE", "").split(",") if n.strip())
    bad = [n for n in names if n not in SANITIZERS]
    if bad:
        raise EqfuseError(f"EQFUSE_SANITIZE: unknown sanitizer '{bad[0]}' (known: {', '.join(SANITIZERS)})")
    return names


def _sanitize_flags() -> tuple[str, ...]:
    names = sanitizers()
    if not names:
        return ()
    # any finding stops the process, so a test run cannot miss it; frame pointers for the reports
    return (f"-fsanitize={','.join(names)}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g")


def _user_flags() -> tuple[str, ...]:
    """EQFUSE_CFLAGS: extra flags for every kernel build, after eqfuse's own."""
    try:
        return tuple(shlex.split(os.environ.get("EQFUSE_CFLAGS", "")))
    except ValueError as e:
        raise EqfuseError(f"EQFUSE_CFLAGS: {e}") from None


def compiler_flags(extra_flags: tuple[str, ...] = ()) -> tuple[str, ...]:
    """FLAGS, NO_DEBUG, the machine model's -march, then extra_flags, EQFUSE_CFLAGS and the
    sanitizers'; with EQFUSE_WERROR=1 in the environment (the test suite sets it) also -Werror:
    generated C must compile cleanly at -Wall, and a warning printed during an ordinary build
    would otherwise go unnoticed."""
    from eqfuse.machine import machine

    werror = ("-Werror",) if os.environ.get("EQFUSE_WERROR") == "1" else ()
    return FLAGS + NO_DEBUG + machine().march + tuple(extra_flags) + _user_flags() + _sanitize_flags() + werror


def link_flags() -> tuple[str, ...]:
    names = sanitizers()
    return LINK_FLAGS + ((f"-fsanitize={','.join(names)}",) if names else ())


# The environment variables setuptools reads when it compiles and links an extension.
BUILD_ENV = ("CC", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED", "ARCHFLAGS")


def cache_key(source: str, cdef: str, extra_flags: tuple[str, ...] = ()) -> str:
    """A hash of everything that changes the library: the source, the compiler (command, path,
    version), every flag (eqfuse's, EQFUSE_CFLAGS, the sanitizers', the build environment's and
    Python's own), what the target flags mean on this CPU, and the versions of eqfuse, Python
    and cffi. A cache shared by machines with different CPUs never loads another ISA's binary."""
    from eqfuse.machine import machine
    from eqfuse.version import __version__

    cc = compiler()
    env = [f"{v}={os.environ.get(v, '')}" for v in BUILD_ENV]
    py = [str(sysconfig.get_config_var(v) or "") for v in ("CC", "CFLAGS", "CCSHARED", "LDSHARED")]
    h = hashlib.sha256()
    for part in (source, cdef, compiler_version(cc), " ".join(compiler_flags(extra_flags)), " ".join(link_flags()),
                 target_isa(cc, machine().march), *env, *py, __version__,
                 sys.implementation.cache_tag or "", _suffix(), cffi.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


# OpenMP threads that wait spin only briefly, then sleep (unless OMP_WAIT_POLICY or GOMP_SPINCOUNT
# say otherwise): libgomp's default, 300000 pauses (milliseconds), lets an idle thread take a
# core from every other thread of the machine, including onnxruntime's or torch's in the same
# process. Not OMP_WAIT_POLICY=PASSIVE, as before: then the calling thread also slept at the end of
# each region and was woken by the worker, and the scheduler moved it onto the worker's CPU, where
# the two took turns (a 2-thread softmax of 4096 x 1024 in blocks of calls ran at its 1-thread
# time; not so with 2000 pauses of spinning: benchmarks/bench_rows.py --threads 1 2). How many
# pauses is a table by vendor (machine.openmp_spin_count): 2000 where it was measured first; more
# on Intel's cores, whose pause is shorter, where a graph of many short GEMM regions between
# one-thread kernels (ResNet-18's convs on AMX tiles) ran several times slower at two threads than
# at one with 2000, its worker asleep when the next region began and woken late (`python
# benchmarks/bench_models.py --precision bf16 --model resnet18`; benchmarks/RESULTS.md). libgomp reads
# this once, when the first library that links it is loaded, so it is set only around that load.
# torch's wheel brings a libgomp.so.1 too, and whichever loads first is the process's one: once
# libgomp is loaded (by torch, or by an earlier module) the variable would change nothing, and
# os.environ is the host process's, so it is then left alone.
SPIN_VAR, SPIN_COUNT = "GOMP_SPINCOUNT", str(host_openmp_spin_count())


def gomp_loaded(maps: str = "/proc/self/maps") -> bool:
    """Whether a libgomp is already loaded in this process (where /proc says; elsewhere, yes:
    the environment is then never touched)."""
    try:
        with open(maps) as f:
            return "libgomp" in f.read()
    except OSError:
        return True


# One library loads at a time: SPIN_VAR is set in the process's environment around a load, and
# two threads loading at once (generate builds its chunk and decode steps on two) would see each
# other's setting, and the second to finish would delete a variable already gone (KeyError).
_LOADING = threading.Lock()


def load_library(name: str, path: Path) -> ModuleType:
    """Import the built library at `path` as the extension module `name` (the name it was built
    with; a module already imported under it is returned as is)."""
    with _LOADING:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        user = "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ or gomp_loaded()
        if not user:
            os.environ[SPIN_VAR] = SPIN_COUNT
        try:
            # (module_from_spec is what loads an extension, and libgomp with it: with the variable set
            # only around exec_module, libgomp never saw it and its threads spun 300000 pauses)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        finally:
            if not user:
                del os.environ[SPIN_VAR]
        sys.modules[name] = mod
        return mod


def _asan_loaded() -> bool:
    """A library built with ASan loads only into a process that started with its runtime
    (else ASan stops the whole process)."""
    try:
        return "libasan" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(final: Path, digest: Path) -> bool:
    """The library is there and has the digest recorded when it was stored (a truncated, emptied
    or bit-flipped library would crash or misbehave when loaded, on every later run)."""
    try:
        return owned_privately(final) and owned_privately(digest) and digest.read_text().strip() == _digest(final)
    except OSError:
        return False


def build(source: str, cdef: str, name_hint: str = "k", *, extra_flags: tuple[str, ...] = ()) -> Built:
    """Compile (or fetch from the cache) a C translation unit exposing the functions in cdef."""
    if "address" in sanitizers() and not _asan_loaded():
        raise EqfuseError("EQFUSE_SANITIZE=address: the ASan runtime must be loaded before Python starts: run with "
                          "LD_PRELOAD=$(gcc -print-file-name=libasan.so) and ASAN_OPTIONS=detect_leaks=0")
    key = cache_key(source, cdef, extra_flags)
    hint = re.sub(r"[^A-Za-z0-9_]", "_", name_hint)[:24] or "k"
    name = f"_eqf_{hint}_{key[:16]}"
    root = private_dir() if no_cache() else usable_cache_dir()  # EQFUSE_NO_CACHE / --no-cache: built afresh
    final = root / (name + _suffix())
    digest = root / f"{name}.sha256"
    cached = True
    if name not in sys.modules and not _intact(final, digest):
        with open(os.open(root / f"{name}.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
            if not _intact(final, digest):
                # Holding the lock, any temporary directory of this key is a killed build's debris.
                for debris in root.glob(f"{name}.*"):
                    if debris.is_dir():
                        shutil.rmtree(debris, ignore_errors=True)
                _compile(name, source, cdef, root, final, digest, extra_flags)
                cached = False
    mod = load_library(name, final)
    return Built(mod.ffi, mod.lib, final, cached)


def _compile(name: str, source: str, cdef: str, root: Path, final: Path, digest: Path, extra_flags) -> None:
    """Build the library in a fresh directory under `root` with setuptools' compiler object, as
    ffi.compile() would (Python's own CFLAGS, and CC, CFLAGS, LDSHARED, ... from the environment),
    without changing the working directory: ffi.compile() did (its build runs in its tmpdir), so
    two threads of one process could not compile at once, and a thread reading a relative path
    while another compiled read the wrong file."""
    from cffi.recompiler import make_c_source
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    ffi = cffi.FFI()
    ffi.cdef(cdef)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=root))
    try:
        c_file = tmp / f"{name}.c"
        make_c_source(ffi, name, source + WRAPPERS_UNOPTIMIZED, str(c_file), verbose=False)
        cc = new_compiler()
        customize_compiler(cc)
        built = tmp / (name + _suffix())
        include = sysconfig.get_paths()["include"]
        flags = list(compiler_flags(extra_flags))
        try:
            pre = _precompiled_header(root, list(cc.compiler_so), include, flags)
            runtime = runtime_object(root, list(cc.compiler_so), include, flags, pre)
            try:
                objs = cc.compile([str(c_file)], output_dir=str(tmp), include_dirs=[include],
                                  extra_postargs=flags + (["-include", str(pre)] if pre else []))
            except Exception:
                if pre is None:
                    raise
                objs = cc.compile([str(c_file)], output_dir=str(tmp), include_dirs=[include], extra_postargs=flags)
            cc.link_shared_object(objs + [str(runtime)], str(built), extra_postargs=list(link_flags()))
        except Exception as e:  # the compiler's failure: setuptools' CompileError or LinkError, by version from different modules
            msg = _compiler_message(tmp, name, extra_flags) or str(e)
            raise CompileError("the C compiler failed on generated code:\n" + msg) from None
        # the source is kept beside the library, for `eqfuse emit` and for debugging
        (tmp / "source.c").write_text(source)
        # the digest first: a reader that sees the new library sees its digest
        (tmp / "sha256").write_text(_digest(built) + "\n")
        for f in (tmp / "source.c", tmp / "sha256", built):
            os.chmod(f, 0o644)  # whatever the umask: nobody else may change what is loaded
        os.replace(tmp / "source.c", root / f"{name}.c")
        os.replace(tmp / "sha256", digest)
        os.replace(built, final)  # atomic: a reader sees no library or the whole library
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# cffi writes its Python wrappers (one per function of the cdef, which only convert arguments and
# call) after the library's source. At -O3 they were a third of a small library's compile time;
# unoptimized they cost the call nothing measurable beside a kernel's run, so the source ends by
# turning gcc's optimization off for what follows. (Only gcc: clang would warn of the pragma.)
WRAPPERS_UNOPTIMIZED = "\n#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC optimize(\"O0\")\n#endif\n"


# The system headers every kernel library includes, parsed once per compiler, flags and cache
# directory into a precompiled header (gcc's `-include X.h` reads X.h.gch when it was built with
# the same options, and the header's text otherwise). immintrin.h alone is most of a small
# kernel library's compile time. Python.h first, as cffi's module source includes it (with
# Py_LIMITED_API, cffi's choice for a release build of Python; a debug build, which has
# sys.gettotalrefcount, gets neither): the module's own #include of it then finds it included,
# and the feature macros are the ones its pyconfig.h gives (_GNU_SOURCE 1).
PRECOMPILED_PYTHON = "" if hasattr(sys, "gettotalrefcount") else "#define Py_LIMITED_API\n#include <Python.h>\n"
PRECOMPILED_HEADERS = ("stdio.h", "immintrin.h", "omp.h", "math.h", "pthread.h", "sched.h", "stddef.h",
                       "stdint.h", "stdlib.h", "string.h", "time.h", "sys/syscall.h", "unistd.h")


def _precompiled_header(root: Path, compiler_so: list[str], include: str, flags: list[str]) -> Path | None:
    """The path X.h of the precompiled system headers for these options (X.h.gch beside it),
    built under `root` on first use (atomically, under a lock: several processes share the
    cache); None when the compiler is not gcc, caching is off, or the build fails: the
    library then compiles with the headers' text, as before."""
    if no_cache() or os.environ.get("EQFUSE_NO_PCH") or "gcc" not in compiler_version(compiler_so[0]).lower():
        return None
    text = PRECOMPILED_PYTHON + "#define _GNU_SOURCE 1\n" + "".join(f"#include <{h}>\n" for h in PRECOMPILED_HEADERS)
    key = hashlib.sha256("\0".join([*compiler_so, include, *flags, compiler_version(compiler_so[0]), text])
                         .encode()).hexdigest()[:16]
    header, gch = root / f"_eqf_pre_{key}.h", root / f"_eqf_pre_{key}.h.gch"
    ready = lambda: header.exists() and gch.exists() and owned_privately(header) and owned_privately(gch)  # noqa: E731
    if ready():
        return header

    def make(tmp: Path) -> None:
        (tmp / "pre.h").write_text(text)
        subprocess.run([*compiler_so, f"-I{include}", *flags, "-x", "c-header", str(tmp / "pre.h"),
                        "-o", str(tmp / "pre.h.gch")], check=True, capture_output=True)
        for f in (tmp / "pre.h", tmp / "pre.h.gch"):
            os.chmod(f, 0o644)
        os.replace(tmp / "pre.h.gch", gch)  # the .gch first: a reader that sees X.h sees its .gch
        os.replace(tmp / "pre.h", header)

    try:
        _build_once(root, f"_eqf_pre_{key}", ready, make)
        return header
    except (OSError, subprocess.CalledProcessError):
        return None


def _build_once(root: Path, stem: str, ready, make) -> None:
    """A cache entry that every library shares, built by one process of those sharing `root`:
    under the lock `stem.lock`, unless ready() (another process built it meanwhile),
    make(tmp) in a fresh directory under `root`, from which it renames its files into place."""
    with open(os.open(root / f"{stem}.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready():
            return
        tmp = Path(tempfile.mkdtemp(prefix=f"{stem}.", dir=root))
        try:
            make(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def runtime_source() -> str:
    """The runtime's translation unit: the header, then csrc_templates/runtime.c."""
    return "#define _GNU_SOURCE 1\n" + header_c() + template("runtime.c")


def runtime_object(root: Path, compiler_so: list[str], include: str, flags: list[str], pre: Path | None) -> Path:
    """The object file of csrc_templates/runtime.c for these options, linked into every kernel
    library: built under `root` on first use (atomically, under a lock, as the precompiled
    header), so that each library compiles only its kernels. Raises CompileError when the
    compiler refuses it."""
    text = runtime_source()
    key = hashlib.sha256("\0".join([*compiler_so, include, *flags, compiler_version(compiler_so[0]), text,
                                     str(pre or "")]).encode()).hexdigest()[:16]
    obj = root / f"_eqf_runtime_{key}.o"
    ready = lambda: obj.exists() and owned_privately(obj)  # noqa: E731
    if ready():
        return obj

    def make(tmp: Path) -> None:
        (tmp / "runtime.c").write_text(text)
        out = subprocess.run([*compiler_so, f"-I{include}", *flags, *(["-include", str(pre)] if pre else []),
                              "-c", str(tmp / "runtime.c"), "-o", str(tmp / "runtime.o")],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise CompileError("the C compiler failed on csrc_templates/runtime.c:\n"
                               + "\n".join(out.stderr.splitlines()[:40]))
        os.chmod(tmp / "runtime.o", 0o644)
        os.replace(tmp / "runtime.o", obj)

    _build_once(root, f"_eqf_runtime_{key}", ready, make)
    return obj


def _compiler_message(tmp: Path, name: str, extra_flags) -> str:
    """Run the compiler again on the generated .c by hand to capture its diagnostics."""
    c_file = tmp / f"{name}.c"
    if not c_file.exists():
        return ""
    inc = sysconfig.get_paths()["include"]
    cc = compiler().split()
    out = subprocess.run(cc + list(compiler_flags(extra_flags)) + ["-I", inc, "-fsyntax-only", str(c_file)],
                         capture_output=True, text=True)
    return "\n".join(out.stderr.splitlines()[:40])


def warnings_for(source: str, extra_flags: tuple[str, ...] = ()) -> str:
    """The compiler's diagnostics for a C source (empty when clean): for tests of generated code.
    A full compile to an object file, not -fsyntax-only: some -Wall warnings (uninitialized
    values, array bounds) come from the optimizer. Python's own CFLAGS come first, as in the
    real (setuptools) build: its -fwrapv alone once turned a clean kernel into a warning."""
    with tempfile.TemporaryDirectory() as d:
        c_file = Path(d) / "check.c"
        c_file.write_text(source)
        cc = compiler().split()
        py = (sysconfig.get_config_var("CFLAGS") or "").split() + (sysconfig.get_config_var("CCSHARED") or "").split()
        out = subprocess.run(cc + py + list(compiler_flags(tuple(extra_flags))) + ["-c", "-o", str(Path(d) / "check.o"),
                                                                          str(c_file)],
                             capture_output=True, text=True)
        return out.stderr


# ------------------------------------------------------------------ templates

PLACEHOLDER = re.compile(r"\{\{([A-Z0-9_]+)\}\}")


def templates_dir() -> Path:
    """csrc_templates/ inside the package when installed (the wheel maps it there), else at the
    top of a source checkout."""
    package = Path(__file__).parent.parent
    installed = package / "csrc_templates"
    return installed if installed.is_dir() else package.parent / "csrc_templates"


@functools.lru_cache(maxsize=None)
def template(name: str) -> str:
    path = templates_dir() / name
    if not path.exists():
        raise FileNotFoundError(f"csrc_templates/{name}")
    return path.read_text()


# The header every generated source starts with: csrc_templates/common.h, then its continuations.
HEADERS = ("common.h", "common_simd.h", "common_pool.h", "common_amx.h")


def header_c(code: str = "") -> str:
    """The kernels' helpers (csrc_templates/common*.h, in order), as one text; for the kernels
    `code` (the C that follows the header), preceded by intrinsics_define(code)."""
    return intrinsics_define(code) + "".join(template(name) for name in HEADERS)


@functools.lru_cache(maxsize=None)
def _intrinsic_use() -> re.Pattern:
    """A use of an x86 intrinsic or vector type, or of a helper defined in the EQF_INTRINSICS part
    of common_simd.h (its functions and macros, read from the header itself)."""
    text = template("common_simd.h")
    part = text[text.index("#if defined(EQF_INTRINSICS)"):]
    names = set(re.findall(r"^#define (\w+)", part, re.M))
    names |= set(re.findall(r"^(?:static|__attribute__)[^;{]*?\b(eqf_\w+)\s*\(", part, re.M))
    return re.compile(r"\b(?:_mm\w*|_tile_\w+|__m(?:128|256|512)\w*|__mmask\w*|" + "|".join(sorted(names)) + r")\b")


# `#if 0` up to its #else, #elif or #endif: code the compiler never sees. Also `#if NAME` of a
# `#define NAME 0` in the code: a pointwise kernel that does not stream (csrc_templates/pointwise.c,
# `#define <kernel>_STREAM 0`) keeps its streaming lines under `#if <kernel>_STREAM`.
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b(.*)$", re.M)
_ZERO_MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+0[ \t]*$", re.M)


def _live(code: str) -> str:
    """code without its `#if 0` blocks."""
    zero = {"0", *_ZERO_MACRO.findall(code)}
    out, pos, depth = [], 0, 0  # depth > 0: inside a dead block, that many #ifs deep
    for m in _DIRECTIVE.finditer(code):
        word = m.group(1)
        if depth == 0:
            if word == "if" and m.group(2).strip() in zero:
                out.append(code[pos:m.start()])
                depth = 1
        elif word.startswith("if"):
            depth += 1
        elif word == "endif":
            depth -= 1
            pos = m.end()
        elif depth == 1:  # the #else or #elif of the `#if 0` itself: live code follows
            depth, pos = 0, m.start()
    if depth == 0:
        out.append(code[pos:])
    return "".join(out)


def intrinsics_define(code: str) -> str:
    """The line that compiles the intrinsics part of the header (`#define EQF_INTRINSICS 1`), for a
    module whose code (the kernels, without the header) uses it; else "". Without it the header
    leaves out <immintrin.h>, about half of gcc's time on a small pointwise module, and about
    half of the modules use no intrinsic."""
    return "#define EQF_INTRINSICS 1\n" if _intrinsic_use().search(_live(code)) else ""


def render(template_name: str, **values) -> str:
    """Fill the {{NAME}} placeholders of csrc_templates/<template_name>; every one, and only those."""
    text = template(template_name)
    wanted = set(PLACEHOLDER.findall(text))
    missing = wanted - set(values)
    unused = set(values) - wanted
    if missing or unused:
        raise KeyError(f"template {template_name}: "
                       + (f"unfilled placeholders {sorted(missing)}" if missing else "")
                       + ("; " if missing and unused else "")
                       + (f"values not used {sorted(unused)}" if unused else ""))
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)
