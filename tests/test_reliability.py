"""Reliability: results never alias a caller's memory; bad input gets a clear error."""

import numpy as np
import pytest

import eqfuse

RESHAPE = "graph g(x: f32[4, 4]) -> f32[16] {\n return reshape(x, shape=[16])\n}\n"


def test_output_never_aliases_a_view_of_the_callers_array():
    base = np.zeros(32, np.float32)
    y = eqfuse.compile(RESHAPE)(base[:16].reshape(4, 4))
    assert not np.shares_memory(y, base)
    y[0] = 1
    assert base[0] == 0


def test_output_never_aliases_the_callers_array_or_another_output():
    mod = eqfuse.compile("graph g(x: f32[4, 4]) -> (f32[16], f32[4, 4], f32[16]) {\n"
                         " y = reshape(x, shape=[16])\n return y, x, y\n}\n")
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    outs = mod(x)
    for i, a in enumerate(outs):
        assert not np.shares_memory(a, x), i
        for b in outs[i + 1:]:
            assert not np.shares_memory(a, b), i
    np.testing.assert_array_equal(outs[1], x)



RELU = "graph g(x: f32[B, 4], w: f32[4, 3]) -> f32[B, 3] {\n return relu(x @ w)\n}\n"


def test_an_empty_array_is_a_clear_error_naming_the_parameter():
    mod = eqfuse.compile(RELU)
    with pytest.raises(eqfuse.ArgumentError, match=r"parameter 'x' is empty \(shape \[0, 4\]\)"):
        mod(np.zeros((0, 4), np.float32), np.ones((4, 3), np.float32))


def test_a_zero_dim_binding_is_a_clear_error():
    with pytest.raises(eqfuse.ArgumentError, match="dims=: 'B' expects a positive integer, got 0"):
        eqfuse.compile(RELU, dims={"B": 0})


@pytest.mark.parametrize("where", ["/nonexistent/o.npz", "{tmp}/model.g/o.npz"])
def test_run_to_an_unwritable_output_exits_2(tmp_path, capsys, where):
    from eqfuse.cli.main import main

    model = tmp_path / "model.g"
    model.write_text(RELU)
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32), w=np.ones((4, 3), np.float32))
    out = where.format(tmp=tmp_path)
    status = main(["run", str(model), "--inputs", str(tmp_path / "in.npz"), "--reference", "-o", out])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"error: {out}: cannot write ("), err
    assert "Traceback" not in err


def test_a_huge_tensor_type_is_refused_at_check(capsys, tmp_path):
    from eqfuse.cli.main import main

    model = tmp_path / "huge.g"
    model.write_text("graph g(x: f32[100000000000, 100000000000]) -> f32 {\n return sum(x)\n}\n")
    assert main(["check", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{model}:1:12: error: a tensor of 10000000000000000000000 elements is too large"), err


def test_parsers_are_built_one_at_a_time():
    """Each thread builds its own lark parser (parser.per_thread), but never two at once: a
    grammar's build reads its literals with ast.literal_eval, whose recursion check CPython 3.11
    keeps per interpreter, and two threads building at once failed test_two_threads_compile_at_once
    with "AST constructor recursion depth mismatch" (parser._BUILDING)."""
    import threading
    import time

    from eqfuse.frontend.parser import per_thread

    active, most, lock = [0], [0], threading.Lock()

    @per_thread
    def build(key):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return key, threading.get_ident()

    got = []
    threads = [threading.Thread(target=lambda: got.append(build("g"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert len({ident for _, ident in got}) == 4  # (one parser per thread still)


@pytest.mark.heavy
def test_two_threads_compile_at_once(tmp_path, monkeypatch):
    """Two threads of one process compiling at once (cold cache): the egglog e-graph each
    optimizer keeps for its rules is its own thread's (egglog's EGraph panics when used from
    another thread: "EGraph is unsendable"), and the C build never changes the working directory
    (a relative path read meanwhile still reads the right file)."""
    import threading

    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    srcs = {k: f"graph f(x: f32[4, 8]) -> f32[4, 8] {{ return relu(x * {k}) + {k} }}\n" for k in (2, 3)}
    for k, s in srcs.items():
        (tmp_path / f"m{k}.g").write_text(s)
    results, errors = {}, []

    def work(k):
        try:
            for _ in range(2):
                mod = eqfuse.compile(f"m{k}.g")  # a relative path, read while the other thread builds C
            results[k] = mod(np.ones((4, 8), np.float32))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(k,)) for k in srcs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in srcs:
        np.testing.assert_allclose(results[k], np.full((4, 8), k + k, np.float32))
