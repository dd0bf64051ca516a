import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))  # so test files can `from helpers import ...`
# every kernel the suite compiles must compile without warnings at -Wall (eqfuse.backend.cbuild.build)
os.environ["EQFUSE_WERROR"] = "1"

# Few, fast examples by default (the machine is shared). "dev" draws new examples on every run
# (`--hypothesis-seed=N` replays one); "ci" is loaded when the environment variable CI is set (CI
# runs with CI=true; CI=, CI=0 and CI=false do not count): derandomized, so the same commit draws
# the same examples on every run and a CI failure is a real one, reproducible with CI=true.
# HYPOTHESIS_PROFILE=thorough (or any profile's name) overrides both.
_FAST = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", **_FAST, derandomize=False)  # explicit: hypothesis derandomizes when CI is set
settings.register_profile("ci", **_FAST, derandomize=True, database=None, print_blob=True)
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _CI else "dev"))

# Pin the machine model the planner and the compiler see, so that no decision depends on the
# host's caches (a 48 KiB L1 once made two tests fail). EQFUSE_TEST_MACHINE picks the model
# (eqfuse.machine.MODELS); "avx2" builds the kernels for x86-64-v3, so that on an AVX-512 host
# the AVX2 code paths really run. Tests of a machine-dependent decision use `machine_model`.
from eqfuse import machine as _machine  # noqa: E402

_machine.pin(os.environ.get("EQFUSE_TEST_MACHINE") or "zen4")

# ... and the optimizer's default time limit far out of the way, so that what saturation reaches,
# and so the kernels a test counts, does not depend on the host's speed or load: the iteration and
# node limits decide (a quantized ViT, saturated for 10 s on a busy 2-core host, was extracted with
# three integer GEMMs computed twice). A test of the time limit passes its own.
from eqfuse.optimizer import egraph as _egraph  # noqa: E402

_egraph.DEFAULT_TIME_LIMIT = 300.0

# ... and the speeds by which a batch is split into compiled bucket sizes (eqfuse.runtime.buckets)
from eqfuse.runtime import buckets as _buckets  # noqa: E402

_buckets.PINNED_SPEEDS = {"flops": 1e11, "bandwidth": 2e10, "overhead": 2e-6}

# Every test optimizes its graphs (several change the optimizer's tunables between two calls on
# one graph): the optimized-graph cache is off but in the tests of it (tests/test_graph_cache.py).
from eqfuse.optimizer import graph_cache as _graph_cache  # noqa: E402

_graph_cache.ENABLED = False

# ... and so is the import cache of ONNX files (tests rewrite and re-import their exports), but in
# its tests (tests/test_import_cache.py)
from eqfuse.frontend import onnx_cache as _onnx_cache  # noqa: E402

_onnx_cache.ENABLED = False

import pytest  # noqa: E402

# The kernel cache: $EQFUSE_CACHE_DIR when it is set (.ci/run sets one for all its tiers; set it to
# keep the kernels' C of a run), else one empty directory for the run, made by the controlling
# process before the xdist workers start (they inherit it) and removed when the run ends.
_RUN_CACHE = "_eqfuse_run_cache"


def pytest_configure(config):
    if os.environ.get("EQFUSE_CACHE_DIR") is None and not hasattr(config, "workerinput"):
        import tempfile

        setattr(config, _RUN_CACHE, tempfile.mkdtemp(prefix="eqfuse-test-cache-"))
        os.environ["EQFUSE_CACHE_DIR"] = getattr(config, _RUN_CACHE)


def pytest_unconfigure(config):
    cache = getattr(config, _RUN_CACHE, None)
    if cache is not None:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop("EQFUSE_CACHE_DIR", None)


@pytest.fixture(params=["zen4", "xeon-spr"])
def machine_model(request):
    """Runs a test once under each of two pinned machines (32 KiB and 48 KiB L1), narrowed to this
    host's ISA as the suite's pin is (the test's kernels run here)."""
    with _machine.pinned(request.param) as m:
        yield m


@pytest.fixture(params=["zen4", "xeon-spr"])
def planned_model(request):
    """machine_model for a test that only plans (and writes C), never builds or runs a kernel: the
    two machines as they are (16-float vectors, AVX512_BF16, xeon-spr's AMX), not narrowed to this
    host, so the test sees the same plans on every host."""
    with _machine.pinned(request.param, clamp=False) as m:
        yield m


@pytest.fixture
def no_vnni():
    """This host's machine model without VNNI: the integer GEMM's paths are avx2_maddubs and the
    exact fallback (kinds.contraction.qgemm.int8_path), so they run on every AVX2, AVX-512 and AMX
    host (tests/test_qgemm_maddubs.py, tests/test_qgemm_fallback.py)."""
    import dataclasses

    m = _machine.machine()
    if m.simd_floats < 8:
        pytest.skip(f"this CPU's vectors hold {m.simd_floats} floats: the integer GEMM's AVX2 paths need AVX2")
    with _machine.pinned(dataclasses.replace(m, simd_floats=8, avx512_vnni=False, avx_vnni=False)) as pinned:
        yield pinned


# ------------------------------------------------------------------ the test tiers
# `pytest` runs the whole suite but the tests marked `extended` (the sanitizer pass and the fuzzers:
# `-m extended` runs them). `pytest -m "not slow" -n 2` is the fast tier, under 2 minutes on 2 cores:
# every test function once, none of the heavy ones. `slow` is never written in a test file;
# it is set here, on
#   - the tests marked `heavy` (more than about 1.5 s each on a Zen 5 core, 3 s on the Zen 4 VM)
#     or `extended`;
#   - every case after the first FAST_CASES of a parametrized test;
#   - the onnx package's backend node tests (its conformance cases, not test functions of ours:
#     the whole suite runs the first DEFAULT_NODE_CASES of each ONNX op, `-m extended` every one).
FAST_CASES = 1
# The whole suite's budget (8 minutes on 2 cores, docs/testing.md): the onnx package's node tests
# after the first DEFAULT_NODE_CASES of each ONNX op are `extended` (each builds a library; the
# first case of an op covers its attributes' common form, our own tests of the op its others
# (tests/test_reference.py, test_onnx_import.py), and `-m extended` runs every case). An op is one
# of test_onnx_node.SUPPORTED, so that reduce_sum and reduce_max each have theirs.
DEFAULT_NODE_CASES = 1


def _group(item, node_test: bool) -> tuple:
    if node_test:  # (its op: the longest of test_onnx_node.SUPPORTED that names it, `test_<op>[_<case>]_cpu`)
        ops = [op for op in item.module.SUPPORTED if item.name.startswith(f"test_{op}_")]
        return item.path, max(ops, key=len, default=item.name)
    return item.path, getattr(item, "originalname", item.name)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers
def pytest_collection_modifyitems(config, items):
    seen: dict[tuple, int] = {}
    for item in items:
        cls = item.cls
        node_test = cls is not None and cls.__name__ == "OnnxBackendNodeModelTest"
        key = _group(item, node_test)
        seen[key] = seen.get(key, 0) + 1
        if node_test and seen[key] > DEFAULT_NODE_CASES:
            item.add_marker(pytest.mark.extended)
        # (the markers looked up last: a lookup walks the item's parents, for each of thousands of items)
        if node_test or seen[key] > FAST_CASES or item.get_closest_marker("heavy") or item.get_closest_marker("extended"):
            item.add_marker(pytest.mark.slow)
