"""A kernel cache shared by processes (eqfuse.backend.cbuild, eqfuse.runtime.artifact): 4 processes
compile the same models and load the same artifact into one empty EQFUSE_CACHE_DIR at once; every
result is right and the cache is left intact (each library matches its digest, no build debris)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

import eqfuse

MODELS = {
    "mlp": "graph mlp(x: f32[4, 32], w: f32[32, 48], b: f32[48]) -> f32[4, 48] { return relu(x @ w + b) }",
    "norm": ("graph norm(x: f32[6, 40]) -> f32[6, 40] {\n"
             "    d = x - mean(x, axis=-1, keepdims=true)\n"
             "    return d / sqrt(mean(d * d, axis=-1, keepdims=true) + 1e-5)\n}"),
}

WORKER = """
import sys
import numpy as np
import eqfuse
from eqfuse.runtime.verify import compare

models = {models!r}
rng = np.random.default_rng(int(sys.argv[1]))
paths = []
for name, text in models.items():
    mod = eqfuse.compile(text)
    f = mod.functions[name]
    xs = [rng.standard_normal([int(d) for d in t.shape], dtype=np.float32) for _, t in f.source.params]
    bad = compare([mod(*xs)], [eqfuse.reference(text)(*xs)])
    assert not bad, (name, bad)
    paths.append(str(f.last.library))
loaded = eqfuse.load({artifact!r})
x = rng.standard_normal((4, 32), dtype=np.float32)
w = np.load({weights!r})
bad = compare([loaded(x)], [eqfuse.reference(models["mlp"])(x, w["w"], w["b"])])
assert not bad, bad
print("LIBS", " ".join(paths))
"""


@pytest.mark.extended  # (four processes' compiles: the whole suite's time)
def test_four_processes_build_into_one_empty_cache_at_once(tmp_path):
    # an artifact made with the test's own cache, whose library the workers extract into the shared one
    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal((32, 48), dtype=np.float32), "b": rng.standard_normal(48, dtype=np.float32)}
    np.savez(tmp_path / "w.npz", **w)
    artifact = eqfuse.compile(MODELS["mlp"], params=w).save(tmp_path / "mlp.eqf")
    cache = tmp_path / "cache"
    script = WORKER.format(models=MODELS, artifact=str(artifact), weights=str(tmp_path / "w.npz"))
    env = {**os.environ, "EQFUSE_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(k)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for k in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    libs = {line for out, _ in outs for line in out.splitlines() if line.startswith("LIBS")}
    assert len(libs) == 1  # every process loaded the same libraries
    # the cache: each library beside its digest, matching; the artifact's library extracted once; no
    # temporary build directory or half-written file left
    names = sorted(p.name for p in cache.iterdir())
    built = [p for p in cache.iterdir() if p.name.startswith("_eqf_") and p.suffix == ".so"]
    kernels = [p for p in built if (cache / (p.name.split(".")[0] + ".sha256")).exists()]
    extracted = [p for p in built if p not in kernels]
    assert len(kernels) == len(MODELS), names
    for p in kernels:
        digest = (cache / (p.name.split(".")[0] + ".sha256")).read_text().strip()
        assert hashlib.sha256(p.read_bytes()).hexdigest() == digest
    assert len(extracted) == 1, names
    assert hashlib.sha256(extracted[0].read_bytes()).hexdigest().startswith(extracted[0].name.split(".")[1])
    # (graphs/, parsers/, rules/: the optimized-graph cache, the parser tables and the checked rules)
    leftovers = [n for n in names if ((cache / n).is_dir() and n not in ("graphs", "parsers", "rules"))
                 or n.endswith(".tmp")]
    assert not leftovers, leftovers
