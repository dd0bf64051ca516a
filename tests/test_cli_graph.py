"""`--graph NAME` selects one graph in every model command, is validated, and only the graphs
processed need their dimensions bound."""

import pytest

from eqfuse.cli.main import main

TWO = """\
graph a(x: f32[B, 4]) -> f32[B, 4] {
    return relu(x)
}
graph b(y: f32[T]) -> f32[T] {
    return exp(y) + 1
}
"""


@pytest.fixture
def two(tmp_path):
    path = tmp_path / "two.g"
    path.write_text(TWO)
    return str(path)


def cli(capsys, *args):
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def test_check_processes_every_graph_or_the_one_named(capsys, two):
    assert cli(capsys, "check", two) == (0, "a(x: f32[B, 4]) -> f32[B, 4]\nb(y: f32[T]) -> f32[T]\n", "")
    assert cli(capsys, "check", two, "--graph", "b", "--dim", "T=3") == (0, "b(y: f32[3]) -> f32[3]\n", "")


@pytest.mark.parametrize("command", ["check", "opt", "emit", "lower", "run", "bench"])
def test_an_unknown_graph_is_a_usage_error_listing_the_graphs(capsys, two, tmp_path, command):
    extra = ["--inputs", tmp_path / "none.npz"] if command == "run" else []
    status, out, err = cli(capsys, command, two, "--graph", "aa", *extra)
    assert status == 2 and out == ""
    assert err == "error: --graph aa: no graph named 'aa' (the file has: a, b)\nnote: did you mean 'a'?\n"


def test_a_dim_of_a_graph_not_processed_is_refused(capsys, two):
    status, _, err = cli(capsys, "check", two, "--graph", "a", "--dim", "T=3")
    assert status == 2 and "has no dimension named 'T' (its named dimensions: B)" in err


def test_opt_prints_only_the_selected_graph(capsys, two):
    status, out, err = cli(capsys, "opt", two, "--graph", "b")
    assert status == 0, err
    assert "graph b(" in out and "graph a(" not in out and "report for graph b" in out


@pytest.mark.parametrize("command", ["emit", "lower"])
def test_only_the_graphs_processed_need_bound_dims(capsys, two, tmp_path, command):
    extra = ["-o", tmp_path / "c"] if command == "emit" else []
    status, _, err = cli(capsys, command, two, "--dim", "B=8", *extra)
    assert status == 2 and err == "error: graph b has unbound dimension T: bind it with --dim T=INT\n"
    status, out, err = cli(capsys, command, two, "--dim", "B=8", "--graph", "a", *extra)
    assert status == 0, err
    if command == "emit":
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["a.c", "a.cdef.h"]
    else:
        assert out.startswith("# graph a: 1 kernels") and "# graph b" not in out


def test_bench_measures_the_first_graph_and_needs_only_its_dims(capsys, two, monkeypatch):
    import eqfuse.cli.bench

    calls = []
    monkeypatch.setattr(eqfuse.cli.bench, "bench_model", lambda src, **kw: calls.append(kw) or "table")
    status, out, err = cli(capsys, "bench", two, "--dim", "B=8")
    assert (status, out) == (0, "table\n") and err.startswith("note: graph a, the first of 2")
    assert cli(capsys, "bench", two, "--graph", "b", "--dim", "T=5") == (0, "table\n", "")
    assert [(c["graph"], c["dims"]) for c in calls] == [("a", {"B": 8}), ("b", {"T": 5})]
    status, _, err = cli(capsys, "bench", two, "--graph", "b")
    assert status == 2 and "graph b has unbound dimension T" in err


def test_bench_peers_are_chosen_and_checked(capsys, two, monkeypatch):
    import eqfuse.cli.bench

    calls = []
    monkeypatch.setattr(eqfuse.cli.bench, "bench_model", lambda src, **kw: calls.append(kw["peers"]) or "table")
    assert cli(capsys, "bench", two, "--dim", "B=8")[0] == 0
    assert cli(capsys, "bench", two, "--dim", "B=8", "--peers", "numpy, torch.compile")[0] == 0
    assert calls == [["numpy", "torch", "torch.compile", "onnxruntime"], ["numpy", "torch.compile"]]
    status, _, err = cli(capsys, "bench", two, "--dim", "B=8", "--peers", "numpy,troch")
    assert status == 2 and err == ("error: --peers: unknown peer 'troch' (known: numpy, torch, torch.compile, "
                                   "onnxruntime, openvino)\nnote: did you mean 'torch'?\n")


@pytest.mark.parametrize("chosen, compiled, labels", [
    (("numpy",), None, []),
    (("numpy", "torch"), False, ["torch eager"]),
    (("torch.compile",), True, ["torch.compile (inductor)"]),
    (("torch", "torch.compile"), True, ["torch eager", "torch.compile (inductor)"]),
])
def test_bench_measures_only_the_chosen_peers(monkeypatch, chosen, compiled, labels):
    import eqfuse.cli.bench
    import eqfuse.cli.peers

    asked = []

    def fake(g, arrays, compiled=True):
        asked.append(compiled)
        return [("torch eager", None)] + ([("torch.compile (inductor)", None)] if compiled else [])

    monkeypatch.setattr(eqfuse.cli.peers, "torch_peers", fake)
    assert [label for label, _ in eqfuse.cli.bench._peers(None, [], chosen)] == labels
    assert asked == ([] if compiled is None else [compiled])


def test_run_takes_the_first_graph_says_so_and_names_the_graph_the_inputs_fit(capsys, two, tmp_path):
    import numpy as np

    np.savez(tmp_path / "a.npz", x=np.ones((2, 4), np.float32))
    np.savez(tmp_path / "b.npz", y=np.ones(3, np.float32))
    status, out, err = cli(capsys, "run", two, "--inputs", tmp_path / "a.npz", "--reference")
    assert status == 0 and out.startswith("out0: f32[2, 4]")
    assert "note: graph a, the first of 2" in err and "--graph NAME picks another" in err
    status, out, err = cli(capsys, "run", two, "--inputs", tmp_path / "b.npz", "--reference")
    assert status == 2 and "has no array for input x" in err
    assert err.rstrip().endswith("note: the inputs fit graph 'b' of " + two + ": did you mean --graph b?"), err
    status, out, err = cli(capsys, "run", two, "--graph", "b", "--inputs", tmp_path / "b.npz", "--reference")
    assert status == 0 and err == ""


def test_times_are_printed_in_the_unit_a_reader_expects_and_the_opt_time_is_labelled(capsys, two):
    from eqfuse.progress import seconds

    assert [seconds(s) for s in (4.123e-4, 9.3606e-3, 1.954)] == ["412.3 us", "9.4 ms", "1.95 s"]
    status, out, err = cli(capsys, "opt", two, "--graph", "a", "--dim", "B=4096")
    report = out[out.index("# report"):]
    assert status == 0 and "#   optimize time: " in report and " in all (load " in report
    line = next(ln for ln in report.splitlines() if ln.startswith("#   extraction:"))
    assert not line.rstrip().endswith(" s"), line  # the extraction line no longer carries the whole time


def test_grad_takes_the_first_graph_and_says_so_as_run_and_bench_do(capsys, tmp_path):
    # issue 29 item 9: one rule for --graph's default (the first graph for run, bench and grad)
    path = tmp_path / "losses.g"
    path.write_text("graph l(x: f32[4]) -> f32 {\n    return sum(x * x)\n}\n"
                    "graph m(y: f32[3]) -> f32 {\n    return sum(exp(y))\n}\n")
    status, out, err = cli(capsys, "grad", path, "--wrt", "x")
    assert status == 0 and out.startswith("graph l") and "note: graph l, the first of 2" in err, (out, err)
    status, out, err = cli(capsys, "grad", path, "--graph", "m", "--wrt", "y")
    assert status == 0 and out.startswith("graph m") and err == "", (out, err)
