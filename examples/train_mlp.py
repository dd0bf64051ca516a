"""Train a 2-layer MLP with SGD on a synthetic 3-class spiral, with numpy arrays and eqfuse modules.

    python examples/train_mlp.py [--epochs 20] [--batch 64] [--lr 0.5]

One eqfuse module does the whole step's arithmetic: `eqfuse.compile(..., grad=[...])` turns the
loss graph of examples/mlp_train.g into a call that returns (loss, logits, dw1, db1, dw2, db2);
numpy only shuffles, slices and applies the update.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import eqfuse

MODEL = Path(__file__).with_name("mlp_train.g")
PARAMS = ("w1", "b1", "w2", "b2")


def spiral(n_per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Three interleaved spiral arms in the plane: not linearly separable."""
    xs, ys = [], []
    for c in range(3):
        r = np.linspace(0.05, 1.0, n_per_class)
        t = np.linspace(c * 4.0, (c + 1) * 4.0, n_per_class) + rng.normal(0, 0.2, n_per_class)
        xs.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        ys.append(np.full(n_per_class, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def init_params(rng: np.random.Generator, hidden: int = 64) -> dict[str, np.ndarray]:
    return {"w1": (rng.normal(0, 1, (2, hidden)) * np.sqrt(2 / 2)).astype(np.float32),
            "b1": np.zeros(hidden, np.float32),
            "w2": (rng.normal(0, 1, (hidden, 3)) * np.sqrt(1 / hidden)).astype(np.float32),
            "b2": np.zeros(3, np.float32)}


def compile_step(batch: int):
    return eqfuse.compile(MODEL, grad=list(PARAMS), dims={"B": batch})


def sgd_step(step, params: dict, x: np.ndarray, labels: np.ndarray, lr: float):
    """One SGD step in place; returns (loss, logits)."""
    onehot = np.eye(3, dtype=np.float32)[labels]
    loss, logits, *grads = step(x=x, onehot=onehot, **params)
    for name, g in zip(PARAMS, grads):
        params[name] -= np.float32(lr) * g
    return float(loss), logits


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    x, y = spiral(256, rng)
    params = init_params(rng)
    step = compile_step(args.batch)
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x))
        losses, correct, seen = [], 0, 0
        for i in range(0, len(x) - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            loss, logits = sgd_step(step, params, x[idx], y[idx], args.lr)
            losses.append(loss)
            correct += int((logits.argmax(axis=1) == y[idx]).sum())
            seen += len(idx)
        print(f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
