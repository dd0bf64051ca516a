import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))  # so test files can `from helpers import ...`
# every kernel the suite compiles must compile without warnings at -Wall (eqfuse.backend.cbuild.build)
os.environ["EQFUSE_WERROR"] = "1"

# Few, fast examples by default (the machine is shared); HYPOTHESIS_PROFILE=thorough for more.
settings.register_profile("default", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Pin the machine model the planner and the compiler see, so that no decision depends on the
# host's caches (a 48 KiB L1 once made two tests fail). EQFUSE_TEST_MACHINE picks the model
# (eqfuse.backend.machine.MODELS); "avx2" builds the kernels for x86-64-v3, so that on an AVX-512 host
# the AVX2 code paths really run. Tests of a machine-dependent decision use `machine_model`.
from eqfuse.backend import machine as _machine  # noqa: E402

_machine.pin(os.environ.get("EQFUSE_TEST_MACHINE") or "zen4")

import pytest  # noqa: E402


@pytest.fixture(params=["zen4", "xeon-spr"])
def machine_model(request):
    """Runs a test once under each of two pinned machines (32 KiB and 48 KiB L1)."""
    with _machine.pinned(request.param) as m:
        yield m
