"""--rules, --disable, --cost and --no-check-rules on every command that optimizes: opt, run, emit,
lower, bench (eqfuse/cli/args.py `_optimizer_options`), passed through to the optimizer."""

import importlib

import numpy as np
import pytest

from eqfuse.cli.main import main
from eqfuse.errors import EqfuseError

MLP = "examples/mlp.g"


class Stop(EqfuseError):
    pass


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "good.rw"
    p.write_text("rule my_silu: ?x * sigmoid(?x) => silu(?x)\n")
    return p


@pytest.fixture
def seen(monkeypatch):
    """optimize_graph records its options and stops the command (nothing is compiled)."""
    calls = []

    def record(g, **kw):
        calls.append(kw)
        raise Stop("stopped by the test")

    monkeypatch.setattr(importlib.import_module("eqfuse.pipeline"), "optimize_graph", record)  # (the optimize stage)
    return calls


@pytest.mark.parametrize("cmd", ["run", "emit", "lower", "bench"])
def test_the_optimizer_options_reach_the_optimizer(capsys, tmp_path, good, seen, cmd):
    inputs = tmp_path / "in.npz"
    rng = np.random.default_rng(0)
    np.savez(inputs, **{k: rng.standard_normal(s).astype(np.float32) for k, s in
                        {"x": (2, 784), "w1": (784, 1024), "b1": (1024,), "w2": (1024, 10), "b2": (10,)}.items()})
    extra = {"run": ["--inputs", str(inputs)], "emit": ["-o", str(tmp_path / "c")], "lower": [],
             "bench": ["--peers", "numpy"]}[cmd]
    argv = [cmd, MLP, "--dim", "B=2", *extra, "--cost", "launches", "--rules", str(good),
            "--disable", "fuse_add_l", "--no-check-rules"]
    assert main(argv) == 2
    assert "stopped by the test" in capsys.readouterr().err
    assert seen and seen[0]["cost"] == "launches"
    assert [str(r) for r in seen[0]["rules"]] == [str(good)] and list(seen[0]["disable"]) == ["fuse_add_l"]


def test_defaults_are_the_built_in_rules_and_memory_cost(capsys, seen):
    assert main(["lower", MLP, "--dim", "B=2"]) == 2
    assert seen[0]["cost"] == "memory" and not seen[0]["rules"] and not seen[0]["disable"]


def _kernels(out: str) -> int:
    return int(out.split("# graph mlp: ")[1].split()[0])


@pytest.mark.heavy
def test_disable_changes_what_lower_and_emit_produce(capsys, tmp_path, good):
    assert main(["lower", MLP, "--dim", "B=4"]) == 0
    assert _kernels(capsys.readouterr().out) == 2
    assert main(["lower", MLP, "--dim", "B=4", "--disable", "fuse_add_l", "--rules", str(good)]) == 0
    assert _kernels(capsys.readouterr().out) == 4  # as docs/optimizing.md says of opt (--disable fuse_add_l: 4 kernels, not 2)
    assert main(["emit", MLP, "--dim", "B=4", "-o", str(tmp_path / "c"), "--disable", "fuse_add_l"]) == 0
    assert ": 4 kernels" in capsys.readouterr().out


def test_a_bad_flag_value_is_a_usage_error(capsys, tmp_path):
    assert main(["lower", MLP, "--dim", "B=4", "--cost", "speed"]) == 2
    out = tmp_path / "c"
    assert main(["emit", MLP, "--dim", "B=4", "-o", str(out), "--disable", "no_such_rule"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'speed'" in err and "no rule named 'no_such_rule'" in err and "Traceback" not in err
    assert not out.exists()  # refused before anything is written
