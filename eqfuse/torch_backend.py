"""`torch.compile(model, backend="eqfuse")`: a TorchDynamo backend over eqfuse.compile.

    compiled = torch.compile(model, backend="eqfuse")      # the name comes from the entry point
    compiled = torch.compile(model, backend=eqfuse_backend, options={"verify": True})

Dynamo captures an FX graph; AOTAutograd turns it into functional ATen (in-place ops removed,
parameters and buffers lifted to graph inputs, scaled-dot-product attention and the fused
TransformerEncoderLayer decomposed into plain ops). The ATen graph is split: the largest groups of
nodes eqfuse converts (eqfuse.frontend.torch_fx) become one eqfuse graph each, compiled to C;
everything else stays a torch call in the same FX graph. What stays in torch is listed once per
compiled graph (a FallbackWarning and the `eqfuse.torch` logger), with each op's count and why.

Parameters are passed at every call, like activations: each call hands eqfuse zero-copy numpy
views of the live tensors, so optimizer.step() and in-place updates are seen by the next call
(nothing is frozen into the compiled graph). Shapes are static per compiled graph: dynamo guards
on them, and a graph dynamo makes shape-polymorphic is specialized here per call signature
(shapes, dtypes and integer arguments), each signature compiled once and cached.

Training works too: AOTAutograd hands the forward and the backward graphs to the same compiler;
the backward's ATen ops eqfuse has no handler for (threshold_backward, ...) stay in torch.

options: "verify" (compare each eqfuse graph's result with eqfuse's numpy reference at every
call), "threads" (eqfuse's thread count; default torch.get_num_threads()), "cost" and "precision"
(eqfuse.compile's: options={"precision": "bf16"} multiplies the GEMMs in bf16, docs/precision.md).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import fx

from eqfuse.errors import EqfuseError
from eqfuse.frontend.torch_aten import Unsupported
from eqfuse.frontend.torch_fx import FxConverter, Support, fallback_counts, op_name
from eqfuse.ir.printer import module_text

log = logging.getLogger("eqfuse.torch")
aten = torch.ops.aten


class FallbackWarning(UserWarning):
    """Some ops of a graph given to torch.compile(backend="eqfuse") run in torch, not in eqfuse."""


@dataclass
class Report:
    """One compiled FX graph: what eqfuse computes and what stays in torch."""

    name: str
    ops: int = 0  # call_function nodes of the ATen graph (getitem excluded)
    partitions: list[str] = field(default_factory=list)  # eqfuse graphs, as .g text
    fallbacks: dict[tuple[str, str], int] = field(default_factory=dict)  # (op, why) -> count
    # each eqfuse kernel's precision and instruction path (mod.report["precision"] of its graphs)
    precision: dict[str, dict[str, str]] = field(default_factory=dict)

    def summary(self) -> str:
        n = sum(self.fallbacks.values())
        head = (f"eqfuse: {self.name}: {n} of {self.ops} ops run in torch "
                f"({len(self.partitions)} eqfuse graph{'s' * (len(self.partitions) != 1)})")
        return head + "".join(f"\n  {op} x{k}: {why}" for (op, why), k in sorted(self.fallbacks.items()))


REPORTS: list[Report] = []  # every graph compiled in this process, latest last


def eqfuse_backend(gm: fx.GraphModule, example_inputs, options: dict | None = None):
    """The backend callable dynamo calls with its FX graph and example inputs."""
    from torch._dynamo.backends.common import aot_autograd

    from eqfuse.pipeline import Options

    opts = dict(options or {})
    unknown = set(opts) - {"verify", "threads", "cost", "precision"}
    if unknown:
        raise EqfuseError(f"torch.compile(backend=\"eqfuse\"): unknown option(s) {', '.join(sorted(unknown))} "
                          "(options: verify, threads, cost, precision)")
    # checked now, where compile's options are (one message naming the option), not at the first call
    Options.of(**{k: opts[k] for k in ("cost", "precision", "verify") if k in opts})
    counter = iter(range(1 << 30))

    def compiler(g: fx.GraphModule, inputs) -> Callable:
        from torch._functorch.aot_autograd import make_boxed_func

        return make_boxed_func(_Specializing(g, inputs, f"graph{next(counter)}", opts))

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, decompositions=decompositions(),
                        keep_inference_input_mutations=True)(gm, example_inputs)


class _Specializing:
    """An ATen graph's callable: compiled once when its shapes are static, else once per call
    signature (the graph is traced again at the call's concrete shapes)."""

    def __init__(self, gm: fx.GraphModule, inputs, name: str, opts: dict):
        self.gm, self.name, self.opts = gm, name, opts
        self.cache: dict[tuple, Callable] = {}
        self.warned: set = set()  # the fallback lists already warned about (once, not per shape)
        self.static = None if _symbolic(gm, inputs) else _split(gm, name, opts, self.warned)

    def __call__(self, *args):
        if self.static is not None:
            return self.static(*args)
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        fn = self.cache.get(key)
        if fn is None:
            from torch.fx.experimental.proxy_tensor import make_fx

            concrete = make_fx(self.gm, tracing_mode="fake")(*args)
            fn = self.cache[key] = _split(concrete, f"{self.name}_{len(self.cache)}", self.opts, self.warned)
        return fn(*args)


def _symbolic(gm: fx.GraphModule, inputs) -> bool:
    if any(isinstance(a, torch.SymInt) for a in inputs):
        return True
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
            return True
    return False


# ---------------------------------------------------------------- splitting and compiling

VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
            aten.transpose.int, aten.t.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default,
            aten.expand.default, aten.clone.default, aten.alias.default, aten.slice.Tensor, aten.select.int,
            aten.scalar_tensor.default, aten.detach.default, aten._to_copy.default}


def _split(gm: fx.GraphModule, name: str, opts: dict, warned: set) -> Callable:
    """gm with its supported parts replaced by eqfuse graphs; the report is kept and, when
    something stays in torch, warned (once per graph and list: not again for each new shape)."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    support = Support()

    class _Ops(OperatorSupportBase):
        def is_node_supported(self, submodules, node: fx.Node) -> bool:
            return support.reason(node) is None

    report = Report(name, ops=sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is not _getitem))
    fallbacks = fallback_counts(gm, support)
    parts = CapabilityBasedPartitioner(gm, _Ops(), allows_single_node_partition=True).propose_partitions()
    kept = []
    for p in parts:
        if any(n.op == "call_function" and n.target is not _getitem and n.target not in VIEW_OPS for n in p.nodes):
            kept.append(p)
        else:  # views and copies alone: nothing to fuse, torch does them without moving data
            for n in p.nodes:
                if n.op == "call_function" and n.target is not _getitem:
                    fallbacks[(op_name(n), "a view between ops that run in torch")] += 1
    split = CapabilityBasedPartitioner(gm, _Ops()).fuse_partitions(kept, prefix="eqfuse_") if kept else gm
    for node in list(split.graph.nodes):
        if node.op == "call_module" and node.target.startswith("eqfuse_"):
            sub = getattr(split, node.target)
            try:
                part = EqfuseGraph(sub, f"{name}_{node.target}", opts)
            except (EqfuseError, Unsupported) as e:
                for n in sub.graph.nodes:
                    if n.op == "call_function" and n.target is not _getitem:
                        fallbacks[(op_name(n), f"its eqfuse graph did not compile: {e}".splitlines()[0])] += 1
                continue
            setattr(split, node.target, part)
            report.partitions.append(part.text)
            report.precision.update(part.module.report.get("precision", {}))
    split.recompile()
    report.fallbacks = dict(fallbacks)
    REPORTS.append(report)
    what = frozenset(report.fallbacks.items())
    if what and what not in warned:
        warned.add(what)
        log.info(report.summary())
        warnings.warn(report.summary(), FallbackWarning, stacklevel=_user_stacklevel())
    return split


_getitem = __import__("operator").getitem


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel, called from the caller of this, that names the user's line: the
    first frame outside eqfuse, torch and the standard library (dynamo compiles deep inside the
    call of the compiled model, and torch's own frames pass through contextlib and functools)."""
    import sysconfig

    import eqfuse

    paths = sysconfig.get_paths()
    ours = tuple(os.path.dirname(m.__file__) + os.sep for m in (eqfuse, torch)) + ("<",)
    stdlib, installed = paths["stdlib"] + os.sep, (paths["purelib"] + os.sep, paths["platlib"] + os.sep)

    def skipped(name: str) -> bool:
        return name.startswith(ours) or (name.startswith(stdlib) and not name.startswith(installed))

    f, level = sys._getframe(1), 1
    while f is not None and skipped(f.f_code.co_filename):
        f, level = f.f_back, level + 1
    return level if f is not None else 1


class EqfuseGraph(torch.nn.Module):
    """One part of the FX graph compiled by eqfuse: tensors in, zero-copy numpy views to the C
    code, its numpy results back as tensors (torch.from_numpy, no copy)."""

    def __init__(self, sub: fx.GraphModule, name: str, opts: dict):
        super().__init__()
        import eqfuse

        conv = FxConverter(name)
        graph = conv.convert(sub)
        self.text = module_text([graph])
        self.single = not isinstance(next(n for n in sub.graph.nodes if n.op == "output").args[0], (tuple, list))
        self.module = eqfuse.compile(self.text, **{k: opts[k] for k in ("cost", "precision") if k in opts})
        self.fn = self.module.default
        self.verify = bool(opts.get("verify"))
        self.threads = opts.get("threads")
        # the optimized graph's parameters as positions of forward's tensors (a zero-size one is none)
        self.order = [conv.placeholders.index(n) for n, _ in self.fn.optimized.params]
        self.given = [k for k, n in enumerate(conv.placeholders) if n is not None]
        self.compiled = self.fn.compiled({})
        log.debug("eqfuse graph %s:\n%s", name, self.text)

    def forward(self, *tensors):
        arrays = [t.detach().numpy() for t in tensors]  # views of the live tensors: never stale
        threads = self.threads or torch.get_num_threads()
        if self.verify:
            self.fn.verify, self.fn.threads = True, threads
            outs = self.fn(*[arrays[k] for k in self.given])
            outs = [outs] if isinstance(outs, np.ndarray) else list(outs)
        else:
            outs = self.compiled.run([arrays[k] for k in self.order], threads)
        res = [torch.from_numpy(o) for o in outs]
        return res[0] if self.single else tuple(res)


# ---------------------------------------------------------------- decompositions


def decompositions() -> dict:
    """ATen ops decomposed before conversion: attention into matmuls and a softmax, and the
    TransformerEncoderLayer fast path (one fused op in eval under no_grad) into its layers."""
    from torch._decomp import get_decompositions

    table = get_decompositions([aten._scaled_dot_product_flash_attention_for_cpu])
    table[aten._transformer_encoder_layer_fwd.default] = _encoder_layer
    return table


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
                   eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1,
                   ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """torch's fused encoder layer (batch first, as the fast path requires) in plain ops."""
    F = torch.nn.functional
    B, L, E = src.shape

    def attention(x):
        qkv = F.linear(x, qkv_weight, qkv_bias).view(B, L, 3, num_heads, E // num_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=_sdpa_mask(mask, mask_type, B, L))
        return F.linear(y.transpose(1, 2).reshape(B, L, E), proj_weight, proj_bias)

    def feed_forward(x):
        h = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)

    def norm(x, w, b):
        return F.layer_norm(x, (E,), w, b, eps)

    if norm_first:
        x = src + attention(norm(src, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attention(src), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


def _sdpa_mask(mask, mask_type, B, L):
    """The fast path's merged mask (True or -inf: masked out) as scaled_dot_product_attention's
    (True: attend; a float mask is added): type 0 is [L, L], 1 a key padding [B, L], 2 [B, H, L, L]."""
    if mask is None:
        return None
    if mask_type == 1:
        mask = mask.view(B, 1, 1, L)
    return ~mask if mask.dtype == torch.bool else mask


def register() -> None:
    """Registers the name "eqfuse" with dynamo in this process (installing eqfuse does it through
    the torch_dynamo_backends entry point; this is for a source checkout)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "eqfuse" not in _BACKENDS:
        register_backend(eqfuse_backend, name="eqfuse")


__all__ = ["eqfuse_backend", "register", "FallbackWarning", "Report", "REPORTS", "decompositions"]
