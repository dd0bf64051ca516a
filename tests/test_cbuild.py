"""The C build cache: hits skip the compiler, concurrent builds agree, errors are reported."""

import subprocess
import sys
import textwrap

import pytest

from eqfuse import cbuild
from eqfuse.cbuild import COMMON_C, COMMON_CDEF, CompileError, build, render


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


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


def test_concurrent_builds_of_one_source(cache):
    script = textwrap.dedent(f"""
        from eqfuse.cbuild import build, COMMON_C, COMMON_CDEF
        b = build(COMMON_C + "int sq(int a) {{ return a * a; }}", COMMON_CDEF + "\\nint sq(int a);", "conc")
        print(b.lib.sq(9))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**__import__("os").environ, "EQFUSE_CACHE_DIR": str(cache)}) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["81"] * 3 and all(p.returncode == 0 for p in procs)
    assert len(list(cache.glob("_eqf_conc_*.so"))) == 1
    assert not [d for d in cache.iterdir() if d.is_dir()]  # no temporary build directory left


def test_killed_compile_leaves_no_library(cache):
    # A leftover temporary directory (as after a kill) is ignored; the build still succeeds.
    (cache / "_eqf_x_0000.tmpjunk").mkdir()
    b = build(COMMON_C + "int one(void) { return 1; }", COMMON_CDEF + "\nint one(void);", "x")
    assert b.lib.one() == 1


def test_compile_error_carries_the_compiler_message(cache):
    with pytest.raises(CompileError, match="expected"):
        build("int broken( {", "int broken(void);", "bad")


def test_render_refuses_missing_and_unused_placeholders():
    with pytest.raises(KeyError, match="unfilled"):
        render("gemm.c", NAME="x")
    src = render("gemm.c", **{k: "1" for k in cbuild.PLACEHOLDER.findall(cbuild.template("gemm.c"))})
    assert "{{" not in src
    with pytest.raises(KeyError, match="not used"):
        render("gemm.c", BOGUS=1, **{k: "1" for k in cbuild.PLACEHOLDER.findall(cbuild.template("gemm.c"))})
