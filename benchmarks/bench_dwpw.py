"""The inverted residual fused (rule fuse_dw_pw: a depthwise conv and its 1x1 conv as one kernel,
backend/kinds/contraction/conv_dwpw.py; rule fuse_pw_dw: its expand 1x1 conv too) against the same
model without it, on the model zoo's tiny MobileNetV2 (tests/zoo_models.py: 32x32 images, batch 2,
TorchScript export).

    python benchmarks/bench_dwpw.py [--threads N] [--repeat N] [--profile]

Three builds of the one export: fused (eqfuse's default), dwpw (the fuse_pw_dw rules disabled: the
expand conv a kernel of its own) and unfused (the fuse_dw_pw and fuse_pw_dw rules disabled: the
depthwise and 1x1 convs as separate kernels). Their calls alternate, 50 calls a sample; the table
gives each one's kernels, its largest difference from the unfused output, and the median and
minimum microseconds a call. --profile adds each build's kernels with their times inside the call
(eqfuse.runtime.profile), in the order they run, with the shapes of the convs: the kernels a
fused one replaces are the expand kernel (expand=1), the depthwise kernel and the 1x1 kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import zoo_models as zm  # noqa: E402

import eqfuse  # noqa: E402
import eqfuse.runtime.profile as prof  # noqa: E402

EXPAND = ("fuse_pw_dw", "fuse_pw_dw_nobias", "fuse_pw_dw_clip", "fuse_pw_dw_relu")
FUSE = ("fuse_dw_pw", "fuse_dw_pw_res", "fuse_dw_pw_res_r", "fuse_dw_pw_nobias") + EXPAND
SHOWN = ("C", "O", "H", "OH", "OW", "M", "N", "K", "group", "olanes", "flat", "expand", "CI", "band", "ro")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=30, help="samples per build")
    ap.add_argument("--profile", action="store_true", help="each build's kernels and their times")
    a = ap.parse_args()
    path = str(zm.export("mobilenet-v2", "torchscript"))
    arrays = list(zm.inputs("mobilenet-v2").values())
    mods = {"fused": eqfuse.compile(path, threads=a.threads),
            "dwpw": eqfuse.compile(path, threads=a.threads, disable=EXPAND),
            "unfused": eqfuse.compile(path, threads=a.threads, disable=FUSE)}
    ref = mods["unfused"](*arrays)
    times: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(a.repeat):
        for k, m in mods.items():
            for _ in range(5):
                m(*arrays)
            t = time.perf_counter()
            for _ in range(50):
                m(*arrays)
            times[k].append((time.perf_counter() - t) / 50 * 1e6)
    print(f"MobileNetV2 (zoo), {a.threads} thread(s)")
    print(f"{'build':14s} {'kernels':>7s} {'max diff':>9s} {'median us':>10s} {'min us':>8s}")
    for k, m in mods.items():
        diff = float(np.abs(m(*arrays) - ref).max())
        print(f"{k:14s} {m.report['kernels_after']:7d} {diff:9.2e} {statistics.median(times[k]):10.1f} "
              f"{min(times[k]):8.1f}")
    if a.profile:
        for k in mods:
            r = prof.profile(mods[k], *arrays, repeat=1000)
            print(f"\n{k}: kernels {sum(x[2] for x in r['kernels']):.1f} us of a {r['call_us']:.1f} us call")
            for (name, _, us, _), kk in zip(r["kernels"], mods[k].kernels):
                d = kk.decisions
                print(f"  {name.rsplit('_', 2)[-2]:5s} {kk.kind:9s} {us:7.2f}  "
                      + " ".join(f"{f}={d[f]}" for f in SHOWN if f in d))


if __name__ == "__main__":
    main()
