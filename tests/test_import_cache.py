"""The import cache (eqfuse/frontend/onnx_cache.py): an ONNX file imported again comes back without
parsing it, its weights memory-mapped and their packed panels kept; a changed file is never served
the old import, whichever way it changed; --no-cache and `eqfuse cache info|clear` apply to it."""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.frontend import onnx_cache, onnx_import  # noqa: E402
from eqfuse.runtime import program  # noqa: E402

X = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)


def write_model(path, seed: int, batch: int | str = 4) -> tuple[np.ndarray, np.ndarray]:
    """relu(x @ w + b), x: [batch, 32], w: [32, 48] (a GEMM with a bound, packed weight); the same
    size of file for every seed."""
    rng = np.random.default_rng(seed)
    w, b = rng.standard_normal((32, 48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y0"]),
         helper.make_node("Relu", ["y0"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 48])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return w, b


def expected(w, b):
    return np.maximum(X @ w + b, 0)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """One cache directory for the file's tests: the model's kernels are built once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def imports(monkeypatch, cache_root):
    """The import cache on, with no entry; the list gets one item per protobuf import."""
    import shutil

    shutil.rmtree(cache_root / "imports", ignore_errors=True)
    monkeypatch.setattr(onnx_cache, "ENABLED", True)
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(cache_root))
    monkeypatch.delenv("EQFUSE_NO_CACHE", raising=False)
    calls = []
    real = onnx_import.import_model

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(onnx_import, "import_model", counted)
    return calls


def run(path):
    return eqfuse.compile(str(path)).default(x=X)


def files(root, suffix):
    d = root / "imports"
    return sorted(f for f in d.iterdir() if f.suffix == suffix) if d.is_dir() else []


@pytest.mark.heavy  # (the fast tier's time)
def test_an_imported_model_is_mapped_and_its_panels_kept(imports, cache_root, tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    w, b = write_model(path, 0)
    np.testing.assert_allclose(run(path), expected(w, b), rtol=1e-4, atol=1e-5)
    assert len(imports) == 1 and len(files(cache_root, ".entry")) == 1 and len(files(cache_root, ".weights")) == 1
    assert files(cache_root, ".panels")  # (the first compile already runs on the mapped weights)
    got = onnx_cache.import_path(path)
    assert len(imports) == 1  # served: no protobuf parsed
    assert all(not a.flags.writeable for a in got.params.values())  # read-only, mapped
    np.testing.assert_array_equal(got.params["w"], w)

    def no_packing(*a):
        raise AssertionError("a warm compile packs no weight it has packed before")

    monkeypatch.setattr(program, "keep_panels", no_packing)
    np.testing.assert_allclose(run(path), expected(w, b), rtol=1e-4, atol=1e-5)
    assert len(imports) == 1


def test_a_warm_compile_with_dims_parses_nothing(imports, cache_root, tmp_path, monkeypatch):
    """dims= is checked against the model's named dims, which are kept too."""
    from eqfuse.frontend import onnx_inputs

    path = tmp_path / "b.onnx"
    w, b = write_model(path, 0, batch="B")
    eqfuse.compile(str(path), dims={"B": 4})

    def no_parse(*a, **kw):
        raise AssertionError("the protobuf was parsed")

    monkeypatch.setattr(onnx_inputs, "load_model", no_parse)
    monkeypatch.setattr(onnx_cache, "load_model", no_parse)
    np.testing.assert_allclose(eqfuse.compile(str(path), dims={"B": 4}).default(x=X), expected(w, b),
                               rtol=1e-4, atol=1e-5)
    assert len(imports) == 1


def test_a_files_header_is_parsed_once_and_a_changed_file_again(imports, tmp_path, monkeypatch):
    """The inputs, dims and name the stages read before an import (a decoder compiled per bucket
    asks at each bucket) come from one parse per file: kept in the process and beside the imports;
    a changed file (its ctime differs) is parsed again."""
    from eqfuse.frontend import onnx_inputs

    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 0.0)
    monkeypatch.setattr(onnx_cache, "_HEADERS", {})
    monkeypatch.setattr(onnx_cache, "_DIGESTS", {})
    parses = []
    real = onnx_inputs.header
    monkeypatch.setattr(onnx_inputs, "header", lambda m: parses.append(1) or real(m))
    path = tmp_path / "h.onnx"
    write_model(path, 0, batch="B")
    first = onnx_cache.header(path)
    assert first.dims == ("B",) and first.inputs == (("x", "x", ("B", 32)),) and first.name == "g"
    assert onnx_cache.header(path) is first and onnx_cache.input_dims(path) == ["B"] and len(parses) == 1
    onnx_cache._HEADERS.clear()  # a new process: the entry beside the imports serves
    assert onnx_cache.header(path) == first and len(parses) == 1
    st = os.stat(path)
    write_model(path, 0, batch="N")  # the same size, the old mtime put back
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert onnx_cache.header(path).dims == ("N",) and len(parses) == 2
    # the import hashes the file's bytes no more: the header's digest of them serves
    import hashlib

    size, hashed, sha256 = os.stat(path).st_size, [], hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda b=b"": hashed.append(len(b)) or sha256(b))
    onnx_cache.import_path(path)
    assert size not in hashed and len(imports) == 1
    # an import keeps the header of the file it parsed: asked after it, the header needs no parse
    other = tmp_path / "h2.onnx"
    write_model(other, 1, batch="M")
    onnx_cache.import_path(other)
    before = len(parses)
    assert onnx_cache.header(other).dims == ("M",) and len(parses) == before


def test_an_import_that_needs_dims_is_remembered(imports, tmp_path, monkeypatch):
    """A model that imports only with its dims bound (a concat along a named dim, as a decoder's
    cache is) is refused again from its entry, with the same message and the dims the concat adds,
    and without a parse; a changed file is imported again."""
    from eqfuse.errors import DimsNeeded
    from eqfuse.frontend import onnx_inputs

    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 0.0)
    path = tmp_path / "cat.onnx"

    def write(axis_name):
        g = helper.make_graph(
            [helper.make_node("Concat", ["past", "new"], ["y"], axis=1)], "g",
            [helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, axis_name, 8]),
             helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, "s", 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "t", 8])])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    write("p")
    with pytest.raises(DimsNeeded) as first:
        onnx_cache.import_path(path)
    assert len(imports) == 1 and first.value.sums

    def no_parse(*a, **kw):
        raise AssertionError("the protobuf was parsed")

    with monkeypatch.context() as m:
        m.setattr(onnx_inputs, "load_model", no_parse)
        m.setattr(onnx_cache, "load_model", no_parse)
        with pytest.raises(DimsNeeded) as again:
            onnx_cache.import_path(path)
    assert (again.value.message, again.value.hint, again.value.sums) == (
        first.value.message, first.value.hint, first.value.sums) and len(imports) == 1
    assert str(again.value) == str(first.value)
    st = os.stat(path)
    write("q")  # the same size, the old mtime put back
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(DimsNeeded) as changed:
        onnx_cache.import_path(path)
    assert len(imports) == 2 and "q" in changed.value.sums


def test_imports_of_a_file_at_other_dims_write_each_weight_once(imports, cache_root, tmp_path, monkeypatch):
    """A model imported at two dims in one process (a decoder's chunk and decode steps, a padded
    model's buckets) writes each weight once: the second entry names the first's file. Of weights
    that differ under the same name and shape (compared element by element), only those are
    written again; an entry one of whose files is gone is not served, and the model is imported
    again."""
    from dataclasses import replace
    from pathlib import Path

    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 0.0)
    monkeypatch.setattr(onnx_cache, "_WRITTEN", {})
    path = tmp_path / "shared.onnx"
    w, b = write_model(path, 0, batch="B")
    for n in (4, 8):
        onnx_cache.import_path(path, {"B": n})
    assert len(imports) == 2 and len(files(cache_root, ".entry")) == 2 and len(files(cache_root, ".weights")) == 1
    for n in (4, 8):  # both served from the one file, mapped
        got = onnx_cache.import_path(path, {"B": n})
        assert not got.params["w"].flags.writeable
        np.testing.assert_array_equal(got.params["w"], w)
        np.testing.assert_array_equal(got.params["b"], b)
    assert len(imports) == 2
    real = Path(os.path.realpath(path))
    root, st = cache_root / "imports", os.stat(real)
    first = files(cache_root, ".weights")[0]
    imp = onnx_cache.import_path(path, {"B": 4})
    other = replace(imp, params={k: np.array(v) + (k == "w") for k, v in imp.params.items()})
    key = onnx_cache._key(real, {"B": 16})
    assert onnx_cache._put(root, key, real, st, onnx_cache._content_digest(real, st, real.read_bytes()), other)
    second = [f for f in files(cache_root, ".weights") if f != first]
    assert len(second) == 1 and second[0].stat().st_size == w.nbytes  # w + 1 alone: b is the first file's
    got = onnx_cache._get(root, key, real)
    np.testing.assert_array_equal(got.params["w"], w + 1)
    np.testing.assert_array_equal(got.params["b"], b)
    first.unlink()
    assert onnx_cache._get(root, key, real) is None and onnx_cache._get(root, onnx_cache._key(real, {"B": 8}), real) is None
    np.testing.assert_array_equal(onnx_cache.import_path(path, {"B": 8}).params["w"], w)
    assert len(imports) == 3


def test_a_changed_file_is_imported_again(imports, cache_root, tmp_path, monkeypatch):
    """Same size, the old mtime put back (os.utime): the ctime differs, so the entry is not served.
    RACY_SECONDS = 0 makes the entry trusted by the file's identity alone."""
    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 0.0)
    path = tmp_path / "m.onnx"
    write_model(path, 0)
    run(path)
    panels = len(files(cache_root, ".panels"))
    st = os.stat(path)
    w, b = write_model(path, 1)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    np.testing.assert_allclose(run(path), expected(w, b), rtol=1e-4, atol=1e-5)
    assert len(imports) == 2
    # the old weights went, and their panels
    assert len(files(cache_root, ".entry")) == 1 and len(files(cache_root, ".weights")) == 1
    assert len(files(cache_root, ".panels")) == panels
    run(path)
    assert len(imports) == 2  # the new entry serves


def test_another_eqfuse_replaces_the_entry(imports, cache_root, tmp_path, monkeypatch):
    """An entry holds the digest of the eqfuse sources that wrote it: another version imports the
    file again and replaces the entry, its weights and their panels (one entry per model)."""
    import eqfuse.cache

    path = tmp_path / "m.onnx"
    w, b = write_model(path, 0)
    run(path)
    monkeypatch.setattr(eqfuse.cache, "code_digest", lambda: "another eqfuse")
    np.testing.assert_allclose(run(path), expected(w, b), rtol=1e-4, atol=1e-5)
    assert len(imports) == 2
    assert len(files(cache_root, ".entry")) == 1 and len(files(cache_root, ".weights")) == 1


def test_a_racy_entry_is_checked_by_content(imports, cache_root, tmp_path, monkeypatch):
    """A file changed within its timestamps' tick keeps its identity (here: a file system whose
    identity is device, inode and size alone); the entry was written within RACY_SECONDS of the
    file's change, so its content is compared, and the change is seen."""
    monkeypatch.setattr(onnx_cache, "_identity", lambda st: (st.st_dev, st.st_ino, st.st_size))
    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 3600.0)
    path = tmp_path / "m.onnx"
    write_model(path, 0)
    run(path)
    run(path)
    assert len(imports) == 1  # the same content: served after the check
    with open(path, "r+b") as f:  # rewritten in place: the same inode
        w, b = write_model(tmp_path / "other.onnx", 2)
        f.write((tmp_path / "other.onnx").read_bytes())
    np.testing.assert_allclose(run(path), expected(w, b), rtol=1e-4, atol=1e-5)
    assert len(imports) == 2


def test_no_cache_and_the_cache_command(imports, cache_root, tmp_path, monkeypatch, capsys):
    from eqfuse.cli.main import main

    path = tmp_path / "m.onnx"
    write_model(path, 0)
    monkeypatch.setenv("EQFUSE_NO_CACHE", "1")
    run(path)
    assert files(cache_root, ".entry") == []
    monkeypatch.delenv("EQFUSE_NO_CACHE")
    run(path)
    assert main(["cache", "info"]) == 0
    assert "imported models: 1 entry" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "1 imported models" in capsys.readouterr().out
    assert list((cache_root / "imports").iterdir()) == []  # the weights and panels too


def write_external(path, seed: int) -> None:
    """write_model's model with its weights in an external data file beside it (`m.data`), as
    large exports are written; the same size of files for every seed."""
    write_model(path, seed)
    m = onnx.load(str(path))
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)


def rewrite_data(data, seed: int) -> None:
    """Seed's weights written over the data file in place (the same inode and size; onnx appends to
    an existing data file, so they are made in a directory of their own first)."""
    other = data.parent / f"seed{seed}"
    other.mkdir()
    write_external(other / "m.onnx", seed)
    data.write_bytes((other / "m.data").read_bytes())


def onnxruntime_output(path) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def test_a_model_with_external_data_is_cached_and_a_changed_data_file_is_seen(imports, cache_root, tmp_path,
                                                                              monkeypatch):
    """Keyed by the model file's and its data file's identity: the second compile parses nothing;
    the data file rewritten (same size, its old mtime put back: the ctime differs) is imported again."""
    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 0.0)
    path, data = tmp_path / "m.onnx", tmp_path / "m.data"
    write_external(path, 0)
    assert data.stat().st_size > 32 * 48 * 4  # (the weights are there, not in the model's file)
    np.testing.assert_allclose(run(path), onnxruntime_output(path), rtol=1e-4, atol=1e-5)
    assert len(imports) == 1 and len(files(cache_root, ".entry")) == 1
    np.testing.assert_allclose(run(path), onnxruntime_output(path), rtol=1e-4, atol=1e-5)
    assert len(imports) == 1  # served: no protobuf parsed, no data file read
    model_st, data_st = os.stat(path), os.stat(data)
    before = onnxruntime_output(path)
    rewrite_data(data, 1)
    os.utime(data, ns=(data_st.st_atime_ns, data_st.st_mtime_ns))
    st = os.stat(data)
    assert (st.st_ino, st.st_size, st.st_mtime_ns) == (data_st.st_ino, data_st.st_size, data_st.st_mtime_ns)
    assert os.stat(path).st_mtime_ns == model_st.st_mtime_ns  # (the model's file is untouched)
    assert not np.allclose(onnxruntime_output(path), before)
    np.testing.assert_allclose(run(path), onnxruntime_output(path), rtol=1e-4, atol=1e-5)
    assert len(imports) == 2
    assert len(files(cache_root, ".entry")) == 1 and len(files(cache_root, ".weights")) == 1
    run(path)
    assert len(imports) == 2  # the new entry serves


def test_a_racy_data_file_is_checked_by_content(imports, cache_root, tmp_path, monkeypatch):
    """As the model file: a data file changed within its timestamps' tick keeps its identity (here:
    device, inode and size alone), so a racy entry compares its content at each hit."""
    monkeypatch.setattr(onnx_cache, "_identity", lambda st: (st.st_dev, st.st_ino, st.st_size))
    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 3600.0)
    path, data = tmp_path / "m.onnx", tmp_path / "m.data"
    write_external(path, 0)
    run(path)
    run(path)
    assert len(imports) == 1  # the same content: served after the check
    rewrite_data(data, 2)
    np.testing.assert_allclose(run(path), onnxruntime_output(path), rtol=1e-4, atol=1e-5)
    assert len(imports) == 2


def test_imports_at_other_dims_share_one_parse_while_asked(imports, cache_root, tmp_path, monkeypatch):
    """Within onnx_cache.sharing_parses() (eqfuse.generate's first compile: a decoder's import at
    no dims and its chunk and decode steps' imports), a file imported at several dims is read and
    parsed once; outside it each import parses the file, and the parse is not kept. With external
    data, an import from the shared parse still records the data file: a changed one is seen."""
    monkeypatch.setattr(onnx_cache, "RACY_SECONDS", 0.0)
    parses = []
    real_load = onnx_cache.load_model
    monkeypatch.setattr(onnx_cache, "load_model", lambda *a, **k: parses.append(1) or real_load(*a, **k))

    def external(where, seed):
        w, _ = write_model(where / "m.onnx", seed, batch="B")
        onnx.save(onnx.load(str(where / "m.onnx")), str(where / "m.onnx"), save_as_external_data=True,
                  all_tensors_to_one_file=True, location="m.data", size_threshold=0)
        return w

    path, data = tmp_path / "m.onnx", tmp_path / "m.data"
    w = external(tmp_path, 0)
    with onnx_cache.sharing_parses():
        for n in (2, 3, 5):
            np.testing.assert_array_equal(onnx_cache.import_path(path, {"B": n}).params["w"], w)
    assert len(imports) == 3 and len(parses) == 1  # three imports, one parse
    assert not onnx_cache._PARSES  # dropped with the context
    for n in (7, 9):
        onnx_cache.import_path(path, {"B": n})
    assert len(imports) == 5 and len(parses) == 3
    other = tmp_path / "seed1"
    other.mkdir()
    w1 = external(other, 1)
    st = os.stat(data)
    data.write_bytes((other / "m.data").read_bytes())
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # (the same size and mtime: the ctime differs)
    np.testing.assert_array_equal(onnx_cache.import_path(path, {"B": 5}).params["w"], w1)
    assert len(imports) == 6
