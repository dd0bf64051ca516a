import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))  # so test files can `from helpers import ...`
# every kernel the suite compiles must compile without warnings at -Wall (eqfuse.cbuild.build)
os.environ["EQFUSE_WERROR"] = "1"

# Few, fast examples by default (the machine is shared); HYPOTHESIS_PROFILE=thorough for more.
settings.register_profile("default", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
