"""Batch inference with Ray Data over a compiled eqfuse Module.

    python examples/ray_batch_inference.py                        # a local Ray instance (ray.init())
    python examples/ray_batch_inference.py --address HOST:PORT    # the same, on a running cluster

The model (examples/mlp.g, random weights) is compiled once, here, into a Module. Ray ships it to
the workers as its artifact (a Module pickles to its artifact: eqfuse.runtime.artifact), so no
worker runs the compiler: `map_batches` with an actor class constructs each actor once per
worker, and its constructor unpickles the Module (eqfuse.load's code: the libraries extracted
into the worker's kernel cache, the weights mapped). Each batch is one call of the Module.

Needs `pip install 'eqfuse[ray]'`. Every output is checked against the numpy reference.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import eqfuse

MODEL = Path(__file__).resolve().parent / "mlp.g"


def make_module(seed: int = 0):
    """(the compiled MLP, its weights): the batch dim B at buckets 1..256 runs any batch size."""
    rng = np.random.default_rng(seed)
    w = {"w1": rng.standard_normal((784, 1024), dtype=np.float32) * 0.05, "b1": rng.standard_normal(1024, dtype=np.float32),
         "w2": rng.standard_normal((1024, 10), dtype=np.float32) * 0.05, "b2": rng.standard_normal(10, dtype=np.float32)}
    return eqfuse.compile(MODEL, params=w, buckets={"B": [1, 16, 256]}), w


class Predict:
    """One per Ray worker: holds the loaded Module and runs a batch per call."""

    def __init__(self, module_ref):
        import ray

        # (a list, so that Ray passes the reference as is: the Module is unpickled here, once)
        self.module = ray.get(module_ref[0])
        os.environ.setdefault("EQFUSE_NUM_THREADS", "1")  # one CPU per actor (num_cpus=1)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = np.ascontiguousarray(batch["x"], dtype=np.float32)
        return {"id": batch["id"], "y": self.module(x)}


def batch_inference(address: str | None = None, rows: int = 4096, workers: int = 2, batch: int = 256,
                    seed: int = 0):
    """(ids, outputs, inputs, weights, seconds): the dataset of `rows` inputs mapped through the
    Module on `workers` actors; `address` None starts a local Ray instance."""
    import ray

    module, w = make_module(seed)
    x = np.random.default_rng(seed + 1).standard_normal((rows, 784), dtype=np.float32)
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    try:
        ref = ray.put(module)  # the artifact's bytes, in the object store once
        ds = ray.data.from_items([{"id": i, "x": x[i]} for i in range(rows)])
        t0 = time.perf_counter()
        out = ds.map_batches(Predict, fn_constructor_args=([ref],), concurrency=workers, batch_size=batch,
                             batch_format="numpy", num_cpus=1).take_all()
        seconds = time.perf_counter() - t0
    finally:
        ray.shutdown()
    ids = np.array([r["id"] for r in out])
    ys = np.stack([r["y"] for r in out])
    return ids, ys, x, w, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description="batch inference with Ray Data over an eqfuse Module")
    ap.add_argument("--address", default=None, help="a Ray cluster's address (default: start a local instance)")
    ap.add_argument("--rows", type=int, default=4096, help="inputs in the dataset (default: 4096)")
    ap.add_argument("--workers", type=int, default=2, help="actors, one CPU each (default: 2)")
    ap.add_argument("--batch", type=int, default=256, help="rows per batch (default: 256)")
    args = ap.parse_args()
    ids, ys, x, w, seconds = batch_inference(args.address, args.rows, args.workers, args.batch)
    ref = eqfuse.reference(MODEL)(x[ids], **w)
    err = float(np.max(np.abs(ys - ref) / (np.abs(ref) + 1)))
    print(f"{len(ids)} rows on {args.workers} workers in {seconds:.2f} s ({len(ids) / seconds:.0f} rows/s, "
          f"actor start-up included); every row seen once: {sorted(ids) == list(range(args.rows))}; "
          f"largest relative error against numpy: {err:.2e}")


if __name__ == "__main__":
    main()
