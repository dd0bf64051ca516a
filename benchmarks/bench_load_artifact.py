"""Start-up from an artifact: `eqfuse.load` of BERT-base's, against onnxruntime's session creation.

    python benchmarks/bench_load_artifact.py [--model bert-base] [--repeat 10] [--artifact PATH]

The model (tests/model_exports.py: BERT-base, 12 layers of 768, random weights, batch 1 x 128
tokens) is exported to ONNX with torch's TorchScript exporter, compiled by eqfuse once and saved
as an artifact (Module.save; --artifact keeps it between runs). Then, --repeat times each, in a
fresh process after `import eqfuse` (or `import onnxruntime`):
- eqfuse.load(path): the manifest's and the libraries' digests checked, the libraries loaded, the
  weights memory-mapped (checked by size);
- eqfuse.load(path, verify=True): also every weight's digest;
- onnxruntime.InferenceSession(path) on the ONNX file (its default options: ORT_ENABLE_ALL);
and the first call of each. Printed: the median and the range, in ms. Also: the compile it replaces.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# One measurement in a fresh process: the time of `setup` is not counted, `timed` is, then one call.
CHILD = """
import json, sys, time
import numpy as np
{setup}
t0 = time.perf_counter()
{timed}
t1 = time.perf_counter()
{call}
t2 = time.perf_counter()
print(json.dumps({{"open": (t1 - t0) * 1e3, "first_call": (t2 - t1) * 1e3}}))
"""

EQFUSE = dict(setup="import eqfuse", timed="m = eqfuse.load({path!r}{verify})",
              call="m(**{{k: v for k, v in np.load({inputs!r}).items()}})")
ORT = dict(setup="import onnxruntime as ort", timed="s = ort.InferenceSession({path!r}, providers=['CPUExecutionProvider'])",
           call="s.run(None, {{k: v for k, v in np.load({inputs!r}).items()}})")


def measure(kind: dict, repeat: int, env: dict, **fmt) -> dict[str, list[float]]:
    code = CHILD.format(setup=kind["setup"], timed=kind["timed"].format(**fmt), call=kind["call"].format(**fmt))
    out: dict[str, list[float]] = {"open": [], "first_call": []}
    for _ in range(repeat):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items():
            out[k].append(v)
    return out


def show(label: str, ms: list[float]) -> str:
    return f"{label:<44} {statistics.median(ms):9.1f} ms   (range {min(ms):.1f} - {max(ms):.1f}, n={len(ms)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-base", help="a model of tests/model_exports.py (default: bert-base)")
    ap.add_argument("--repeat", type=int, default=10, help="fresh processes per measurement (default: 10)")
    ap.add_argument("--artifact", help="the artifact's path: made if missing, else reused "
                                       "(default: a temporary file, made again)")
    args = ap.parse_args()

    import model_exports as me

    onnx_path = me.export(args.model, "torchscript")
    inputs = {k: v for k, v in me.inputs(args.model).items()}
    tmp = Path(tempfile.mkdtemp(prefix="bench_load_"))
    np.savez(tmp / "inputs.npz", **inputs)
    path = Path(args.artifact) if args.artifact else tmp / f"{args.model}.eqf"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if not path.exists():
        import eqfuse

        t0 = time.perf_counter()
        mod = eqfuse.compile(str(onnx_path))
        t1 = time.perf_counter()
        mod.save(path)
        t2 = time.perf_counter()
        print(f"compile {t1 - t0:.1f} s (kernel cache as it is), save {t2 - t1:.1f} s")
    print(f"{args.model}: artifact {path.stat().st_size / 1e6:.0f} MB, ONNX {onnx_path.stat().st_size / 1e6:.0f} MB; "
          f"{os.cpu_count()} CPUs (shared machine: other work may run beside)")
    rows = [("eqfuse.load", measure(EQFUSE, args.repeat, env, path=str(path), verify="", inputs=str(tmp / "inputs.npz"))),
            ("eqfuse.load(verify=True)", measure(EQFUSE, args.repeat, env, path=str(path), verify=", verify=True",
                                                 inputs=str(tmp / "inputs.npz")))]
    try:
        import onnxruntime  # noqa: F401

        rows.append(("onnxruntime.InferenceSession", measure(ORT, args.repeat, env, path=str(onnx_path),
                                                             inputs=str(tmp / "inputs.npz"))))
    except ImportError:
        print("onnxruntime is not installed: its session creation is not measured")
    for label, r in rows:
        print(show(label, r["open"]))
        print(show("  then its first call", r["first_call"]))


if __name__ == "__main__":
    main()
