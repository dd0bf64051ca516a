"""The C build cache: hits skip the compiler, concurrent builds agree, errors are reported."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eqfuse import cache as cache_mod
from eqfuse.backend import cbuild
from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, CompileError, build, render


@pytest.fixture(scope="module")
def shared_entries(tmp_path_factory) -> list[Path]:
    """The cache entries every library shares (the precompiled header and the runtime object),
    built once in a directory of their own: for this process's flags (the suite's pinned machine)
    and for a fresh process's (the host's), which the tests' subprocesses build with."""
    root = tmp_path_factory.mktemp("shared-entries")
    before = os.environ.get("EQFUSE_CACHE_DIR")
    os.environ["EQFUSE_CACHE_DIR"] = str(root)
    try:
        build(COMMON_C + "int seed(void) { return 1; }", COMMON_CDEF + "\nint seed(void);", "seed")
    finally:
        if before is None:
            del os.environ["EQFUSE_CACHE_DIR"]
        else:
            os.environ["EQFUSE_CACHE_DIR"] = before
    assert _run_twice(root) == (0, "False 42")
    return sorted(p for p in root.iterdir() if p.name.startswith(("_eqf_pre_", "_eqf_runtime_")) and p.suffix != ".lock")


@pytest.fixture
def cache(tmp_path, monkeypatch, shared_entries):
    """An empty kernel cache but for the entries every library shares, copied in: what a test of
    one library's build, hit or rebuild checks is that library's (the shared entries' own tests,
    test_the_precompiled_system_headers_are_built_once... and test_the_runtime_is_compiled_once...,
    start from an empty directory)."""
    for entry in shared_entries:
        shutil.copy2(entry, tmp_path / entry.name)
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.heavy  # (the fast tier's time)
def test_second_build_is_a_cache_hit(cache, monkeypatch):
    src = COMMON_C + "int add3(int a) { return a + 3; }"
    first = build(src, COMMON_CDEF + "\nint add3(int a);", "t")
    assert not first.cached and first.lib.add3(4) == 7

    def no_compiler(*a, **k):
        raise AssertionError("the compiler ran on a cache hit")

    monkeypatch.setattr(cbuild, "_compile", no_compiler)
    second = build(src, COMMON_CDEF + "\nint add3(int a);", "t")
    assert second.cached and second.lib.add3(1) == 4


def test_key_depends_on_source_and_flags():
    assert cbuild.cache_key("a", "b") != cbuild.cache_key("a ", "b")
    assert cbuild.cache_key("a", "b") != cbuild.cache_key("a", "b", ("-O0",))


@pytest.mark.heavy  # (the fast tier's time)
def test_concurrent_builds_of_one_source(cache):
    script = textwrap.dedent("""
        from eqfuse.backend.cbuild import build, COMMON_C, COMMON_CDEF
        b = build(COMMON_C + "int sq(int a) { return a * a; }", COMMON_CDEF + "\\nint sq(int a);", "conc")
        print(b.lib.sq(9))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**__import__("os").environ, "EQFUSE_CACHE_DIR": str(cache)}) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["81"] * 3 and all(p.returncode == 0 for p in procs)
    assert len(list(cache.glob("_eqf_conc_*.so"))) == 1
    assert not [d for d in cache.iterdir() if d.is_dir()]  # no temporary build directory left


@pytest.mark.heavy  # (the fast tier's time)
def test_killed_compile_leaves_no_library(cache):
    # A process killed mid-compile leaves its private temporary directory and no library under the
    # final name; the next build of that key ignores the debris, succeeds and clears it.
    src, cdef = COMMON_C + "int one(void) { return 1; }", COMMON_CDEF + "\nint one(void);"
    name = f"_eqf_x_{cbuild.cache_key(src, cdef)[:16]}"
    (cache / f"{name}.killed").mkdir()
    (cache / f"{name}.killed" / f"{name}.o").write_bytes(b"half an object file")
    b = build(src, cdef, "x")
    assert b.lib.one() == 1 and not b.cached
    assert not [d for d in cache.iterdir() if d.is_dir()]


@pytest.mark.heavy  # (the fast tier's time)
def test_threads_of_one_process_build_at_once(cache):
    # cffi changes the working directory while compiling: builds from threads must not interfere
    from concurrent.futures import ThreadPoolExecutor

    def one(k):
        return build(COMMON_C + f"int k{k}(void) {{ return {k}; }}", COMMON_CDEF + f"\nint k{k}(void);", "thr")

    with ThreadPoolExecutor(3) as pool:
        built = list(pool.map(one, range(3)))
    assert [getattr(b.lib, f"k{k}")() for k, b in enumerate(built)] == [0, 1, 2]


@pytest.mark.heavy  # (the fast tier's time)
def test_threads_helper(cache):
    b = build(COMMON_C, COMMON_CDEF, "threads")
    b.lib.eqf_set_threads(1)
    assert b.lib.eqf_get_threads() == 1
    b.lib.eqf_set_threads(2)
    assert b.lib.eqf_get_threads() == 2


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("EQFUSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_mod.cache_dir() == tmp_path / "eqfuse"
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path / "x"))
    assert cache_mod.cache_dir() == tmp_path / "x"


@pytest.mark.heavy  # (the fast tier's time)
def test_compile_error_carries_the_compiler_message(cache):
    with pytest.raises(CompileError, match="expected") as err:
        build("int broken( {", "int broken(void);", "bad")
    assert "error" in str(err.value) and len(str(err.value).splitlines()) <= 42


def test_render_refuses_missing_and_unused_placeholders():
    with pytest.raises(KeyError, match="unfilled"):
        render("gemm.c", NAME="x")
    src = render("gemm.c", **{k: "1" for k in cbuild.PLACEHOLDER.findall(cbuild.template("gemm.c"))})
    assert "{{" not in src
    with pytest.raises(KeyError, match="not used"):
        render("gemm.c", BOGUS=1, **{k: "1" for k in cbuild.PLACEHOLDER.findall(cbuild.template("gemm.c"))})


def test_machine_description_and_blocking(monkeypatch):
    from dataclasses import replace

    from eqfuse import machine

    m = machine.machine()
    assert m.l1 > 0 and m.l2 > m.l1 and m.simd_floats in (4, 8, 16) and m.cores >= 1
    mc, nc, kc, mr, nr = machine.gemm_blocking(m)
    assert mc % mr == 0 and nc % nr == 0 and kc > 0
    assert mr * kc * 4 <= m.l1 and kc * nc * 4 <= m.l2  # the A micro-panel in L1, the B panel in L2
    assert machine.gemm_blocking(replace(m, l2=m.l2 // 4))[1] < nc  # a smaller L2, a narrower B panel


def test_host_machine_reads_the_environment_overrides(monkeypatch):
    from eqfuse import machine

    monkeypatch.setenv("EQFUSE_L2", str(256 << 10))
    machine.host_machine.cache_clear()
    try:
        assert machine.host_machine().l2 == 256 << 10
    finally:
        monkeypatch.undo()
        machine.host_machine.cache_clear()


def test_a_pinned_machine_is_what_the_planner_and_the_compiler_see():
    from eqfuse import machine
    from eqfuse.backend import cbuild

    with machine.pinned("xeon-spr") as m:
        assert machine.machine().l1 == 48 << 10 and m.l1 == 48 << 10
    with machine.pinned("avx2"):
        assert machine.machine().simd_floats == 8
        assert "-march=x86-64-v3" in cbuild.compiler_flags() or machine.host_simd_floats() == 8


def _truncate(b: bytes) -> bytes:
    return b[:1000]


def _flip_bit(b: bytes) -> bytes:
    return b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 0x10]) + b[len(b) // 2 + 1:]


@pytest.mark.heavy  # (the fast tier's time)
# (the empty and the random library in the extended tier: the suite's time)
@pytest.mark.parametrize("damage", [_truncate, pytest.param(lambda b: b"", marks=pytest.mark.extended),
                                    pytest.param(lambda b: __import__("os").urandom(len(b)), marks=pytest.mark.extended),
                                    _flip_bit],
                         ids=["truncated", "empty", "random", "bit-flipped"])
def test_a_damaged_library_in_the_cache_is_rebuilt(cache, damage):
    # Each run is a fresh process, as a later run of eqfuse would be: loading a damaged library
    # can crash the process (a truncated one gave SIGBUS), so it must be caught before loading.
    assert _run_twice(cache) == (0, "False 42")
    (lib,) = cache.glob("_eqf_twice_*.so")
    lib.write_bytes(damage(lib.read_bytes()))
    assert _run_twice(cache) == (0, "False 42")  # rebuilt
    assert _run_twice(cache) == (0, "True 42")


def _run_twice(cache):
    """A fresh process builds (or loads) a small library from the cache: (exit status, 'cached? 42')."""
    script = textwrap.dedent("""
        from eqfuse.backend.cbuild import build
        b = build("int twice(int a) { return 2 * a; }", "int twice(int a);", "twice")
        print(b.cached, b.lib.twice(21))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "EQFUSE_CACHE_DIR": str(cache)})
    return p.returncode, p.stdout.strip()


@pytest.mark.parametrize("var, value", [("CC", "gcc -DX"), ("CFLAGS", "-fsanitize=address"), ("LDFLAGS", "-lm"),
                                        ("CPPFLAGS", "-DX"), ("EQFUSE_CFLAGS", "-DX"),
                                        ("EQFUSE_SANITIZE", "undefined")])
def test_key_depends_on_the_build_environment(monkeypatch, var, value):
    monkeypatch.delenv(var, raising=False)
    before = cbuild.cache_key("a", "b")
    monkeypatch.setenv(var, value)
    assert cbuild.cache_key("a", "b") != before


def test_key_depends_on_the_eqfuse_version_and_the_target_isa(monkeypatch):
    from eqfuse import version

    before = cbuild.cache_key("a", "b")
    monkeypatch.setattr(version, "__version__", version.__version__ + ".post1")
    assert cbuild.cache_key("a", "b") != before
    monkeypatch.undo()
    # another CPU: the same -march=native flag, another instruction set
    monkeypatch.setattr(cbuild, "target_isa", lambda cc, flags: "-march=another-cpu")
    assert cbuild.cache_key("a", "b") != before


def test_target_isa_spells_out_native():
    isa = cbuild.target_isa(cbuild.compiler(), ("-march=native",))
    assert "-march=native" not in isa and "-m" in isa


@pytest.mark.heavy  # (the fast tier's time)
def test_eqfuse_cflags_reach_the_kernel_build(cache, monkeypatch):
    monkeypatch.setenv("EQFUSE_CFLAGS", "-DEQF_TEST_VALUE=7")
    assert build("int value(void) { return EQF_TEST_VALUE; }", "int value(void);", "cflags").lib.value() == 7


def test_unknown_sanitizer_is_a_clear_error(monkeypatch):
    from eqfuse.errors import EqfuseError

    monkeypatch.setenv("EQFUSE_SANITIZE", "address,memory")
    with pytest.raises(EqfuseError, match="unknown sanitizer 'memory'"):
        cbuild.compiler_flags()


@pytest.mark.heavy
def test_a_library_others_can_write_is_rebuilt(cache):
    assert _run_twice(cache) == (0, "False 42")
    (lib,) = cache.glob("_eqf_twice_*.so")
    lib.chmod(0o666)  # anyone could have replaced its code
    assert _run_twice(cache) == (0, "False 42")
    assert lib.stat().st_mode & 0o777 == 0o644


@pytest.mark.heavy  # (the fast tier's time)
def test_cache_entries_are_private_whatever_the_umask(tmp_path, monkeypatch):
    import os

    root = tmp_path / "new" / "cache"
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(root))
    old = os.umask(0)
    try:
        build("int umask0(void) { return 0; }", "int umask0(void);", "umask0")
    finally:
        os.umask(old)
    assert root.stat().st_mode & 0o777 == 0o700
    modes = {p.suffix: p.stat().st_mode & 0o777 for p in root.iterdir()}
    assert modes == {".so": 0o644, ".c": 0o644, ".sha256": 0o644, ".lock": 0o600, ".h": 0o644, ".gch": 0o644,
                     ".o": 0o644}, modes  # (.o: the runtime's object file, cbuild.runtime_object)


@pytest.mark.heavy
def test_the_precompiled_system_headers_are_built_once_and_a_damaged_one_is_not_used(tmp_path, monkeypatch):
    """The system headers are parsed once per compiler and flags into X.h.gch (cbuild.PRECOMPILED_HEADERS);
    a .gch that others can write is built again, and one that is damaged costs the header's text, not
    the build: the library still compiles and runs."""
    import os

    from eqfuse.backend.cbuild import compiler_version

    if "gcc" not in compiler_version().lower():
        pytest.skip("the precompiled header is gcc's")
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EQFUSE_NO_PCH", raising=False)
    assert build("int pch1(void) { return 1; }", "int pch1(void);", "pch1").lib.pch1() == 1
    (gch,) = tmp_path.glob("_eqf_pre_*.h.gch")
    first = gch.stat().st_ino
    assert build("int pch2(void) { return 2; }", "int pch2(void);", "pch2").lib.pch2() == 2
    assert gch.stat().st_ino == first  # built once
    gch.chmod(0o666)
    assert build("int pch3(void) { return 3; }", "int pch3(void);", "pch3").lib.pch3() == 3
    assert gch.stat().st_ino != first and gch.stat().st_mode & 0o777 == 0o644
    with open(gch, "r+b") as f:
        f.truncate(1000)
    os.chmod(gch, 0o644)
    assert build("int pch4(void) { return 4; }", "int pch4(void);", "pch4").lib.pch4() == 4


@pytest.mark.heavy
def test_a_module_source_reads_every_system_header_from_the_precompiled_one(tmp_path, monkeypatch):
    """cffi's module source (Python.h first, then the kernels' headers) compiled with the
    precompiled header as cbuild does: gcc uses the .gch (-H marks it "!") and parses no system
    header's text (a nested "..", Python.h's own, would mean the .gch no longer covers it)."""
    import subprocess
    import sysconfig

    import cffi
    from cffi.recompiler import make_c_source
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    from eqfuse.backend.cbuild import (
        COMMON_C,
        compiler_flags,
        compiler_version,
        header_c,
    )

    if "gcc" not in compiler_version().lower():
        pytest.skip("the precompiled header is gcc's")
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EQFUSE_NO_PCH", raising=False)
    code = header_c("_mm256_setzero_ps()") + COMMON_C + "int pch6(void) { return 6; }"
    assert build(code, "int pch6(void);", "pch6").lib.pch6() == 6
    (gch,) = tmp_path.glob("_eqf_pre_*.h.gch")
    ffi = cffi.FFI()
    ffi.cdef("int pch6(void);")
    make_c_source(ffi, "_pch6", code, str(tmp_path / "m.c"), verbose=False)
    cc = new_compiler()
    customize_compiler(cc)
    out = subprocess.run([*cc.compiler_so, f"-I{sysconfig.get_paths()['include']}", *compiler_flags(), "-Winvalid-pch", "-H",
                          "-include", str(gch)[:-4], "-c", str(tmp_path / "m.c"), "-o", str(tmp_path / "m.o")],
                         capture_output=True, text=True, check=True)
    lines = out.stderr.splitlines()
    assert f"! {gch}" in lines, out.stderr[:2000]
    assert not [line for line in lines if line.startswith("..")], out.stderr[:2000]


def _unsafe_cache(tmp_path, monkeypatch, kind):
    import os

    root = tmp_path / "cache"
    if kind == "a file":
        root.write_text("not a directory")
    elif kind == "writable by others":
        root.mkdir()
        root.chmod(0o777)
    else:  # another user's: seen from a process of another uid
        root.mkdir(mode=0o700)
        uid = os.getuid() + 1
        monkeypatch.setattr(os, "getuid", lambda: uid)
    return root


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("kind", ["a file", "writable by others", "another user's"])
def test_an_unusable_cache_dir_falls_back_to_a_temporary_one(tmp_path, monkeypatch, kind):
    root = _unsafe_cache(tmp_path, monkeypatch, kind)
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(root))
    with pytest.warns(cache_mod.CacheWarning, match=f"kernel cache {root} is"):
        b = build(f"int fb(void) {{ return {len(kind)}; }}", "int fb(void);", "fallback")
    assert b.lib.fb() == len(kind)
    assert root not in b.path.parents


def test_only_code_that_uses_intrinsics_compiles_the_headers_intrinsics():
    """The header's intrinsics part (with <immintrin.h>, half of gcc's time on a small module) is
    compiled for code that uses an intrinsic, a vector type or a helper of that part; code under
    `#if 0`, or under `#if X` of a `#define X 0`, does not count."""
    on = "#define EQF_INTRINSICS 1\n"
    assert cbuild.intrinsics_define("void f(float* y) { y[0] = 1; }") == ""
    assert cbuild.intrinsics_define("__m512 v;") == on
    assert cbuild.intrinsics_define("s = eqf_row_exp_sum(y, n, 1, m, 0);") == on
    assert cbuild.intrinsics_define("int eqf_mm512_count, EQF_ROW_BLOCK_4 = EQF_ROW_BLOCK(4);") == ""
    assert cbuild.intrinsics_define("#define k_STREAM 0\n#if k_STREAM\neqf_sfence();\n#else\nx();\n#endif\n") == ""
    assert cbuild.intrinsics_define("#define k_STREAM 1\n#if k_STREAM\neqf_sfence();\n#endif\n") == on
    assert cbuild.intrinsics_define("#if 0\n#if A\n_mm_sfence();\n#endif\n#else\n_mm_pause();\n#endif\n") == on
    assert cbuild.intrinsics_define("#if 0\n#if A\n#else\n_mm_sfence();\n#endif\n#endif\nint a;\n") == ""
    assert cbuild.header_c("__m512 v;").startswith(on) and not cbuild.header_c().startswith(on)


@pytest.mark.heavy  # (the fast tier's time)
def test_loading_a_module_leaves_the_environment_alone_once_libgomp_is_loaded(cache, monkeypatch):
    # GOMP_SPINCOUNT only matters before libgomp loads; afterwards (torch loaded it, or an earlier
    # module did) os.environ is the host's and is not written, even for the length of a load
    import os

    class Watched(dict):
        def __setitem__(self, k, v):
            assert k.startswith("PYTEST_"), f"os.environ[{k!r}] written"  # (pytest's own, at teardown)
            super().__setitem__(k, v)

        def __delitem__(self, k):
            assert k.startswith("PYTEST_"), f"os.environ[{k!r}] deleted"
            super().__delitem__(k)

    build(COMMON_C + "int one(void) { return 1; }", COMMON_CDEF + "\nint one(void);", "t")  # libgomp loaded
    assert cbuild.gomp_loaded()
    monkeypatch.setattr(os, "environ", Watched(os.environ))
    b = build(COMMON_C + "int two(void) { return 2; }", COMMON_CDEF + "\nint two(void);", "t")
    assert b.lib.two() == 2


def test_gomp_loaded_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert not cbuild.gomp_loaded(str(maps))
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /x/torch/lib/libgomp.so.1\n")
    assert cbuild.gomp_loaded(str(maps)) and cbuild.gomp_loaded(str(tmp_path / "absent"))


def test_libraries_load_one_at_a_time_around_the_spin_variable(monkeypatch):
    """Before libgomp is loaded, a load sets GOMP_SPINCOUNT around it; two threads loading at
    once (generate builds its chunk and decode steps on two) saw each other's setting, and the
    second to finish deleted a variable already gone: KeyError 'GOMP_SPINCOUNT' (a warm first
    generation, its libraries loaded from the cache at once). Loads now take turns: none
    overlaps, each sees the variable, and it is gone after."""
    import threading
    import time
    import types

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(cbuild, "gomp_loaded", lambda *a: False)
    active, most, seen, lock = [0], [0], [], threading.Lock()

    class Loader:
        def exec_module(self, mod):
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            seen.append(os.environ.get(cbuild.SPIN_VAR))
            time.sleep(0.02)
            with lock:
                active[0] -= 1

    monkeypatch.setattr(cbuild.importlib.util, "spec_from_file_location",
                        lambda name, path: types.SimpleNamespace(name=name, loader=Loader()))
    monkeypatch.setattr(cbuild.importlib.util, "module_from_spec", lambda spec: types.ModuleType(spec.name))
    names = [f"_eqf_test_turns_{i}" for i in range(4)]
    errors = []

    def load(name):
        try:
            cbuild.load_library(name, Path("/nonexistent.so"))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))
    threads = [threading.Thread(target=load, args=(n,)) for n in names]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for n in names:
            sys.modules.pop(n, None)
    assert not errors and most[0] == 1 and seen == [cbuild.SPIN_COUNT] * 4
    assert cbuild.SPIN_VAR not in os.environ


def test_the_runtime_is_compiled_once_and_each_library_keeps_its_own(tmp_path, monkeypatch):
    """csrc_templates/runtime.c is built once per compiler and flags (cbuild.runtime_object) and
    linked into every library: two libraries of the header share the one object file, each has
    its own pool (its workers' thread ids apart), and no runtime symbol is exported from a
    library, where it could be bound to another library's copy."""
    from eqfuse.backend.cbuild import HEADER_CDEF, header_c

    def lib(k: int):
        src = header_c() + COMMON_C + f"int pool{k}(void) {{ eqf_pool_request = 2; return eqf_pool_threads(); }}"
        return build(src, COMMON_CDEF + "\n" + HEADER_CDEF + f"\nint pool{k}(void);", f"rt{k}")

    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path))
    a, b = lib(1), lib(2)
    assert a.lib.pool1() == 2 and b.lib.pool2() == 2
    assert len(list(tmp_path.glob("_eqf_runtime_*.o"))) == 1
    assert a.ffi.cast("long", a.lib.eqf_pool_tids()) != b.ffi.cast("long", b.lib.eqf_pool_tids())
    dynamic = subprocess.run(["nm", "-D", "--defined-only", str(a.path)], capture_output=True, text=True).stdout
    assert "pool1" in dynamic and not any(n in dynamic for n in ("eqf_parallel_for", "eqf_pool_request", "eqf_scratch"))


def test_the_openmp_spin_is_a_table_by_vendor():
    """machine.openmp_spin_count: 2000 pauses, 20000 on Intel's shorter ones; cbuild sets the
    host's around a library's load (above)."""
    from eqfuse import machine

    info = "processor\t: 0\nvendor_id\t: {}\n"
    assert machine.openmp_spin_count(info.format("AuthenticAMD")) == machine.openmp_spin_count("") == 2000
    assert machine.openmp_spin_count(info.format("GenuineIntel")) == 20000
    assert cbuild.SPIN_COUNT == str(machine.host_openmp_spin_count())
