"""The serialized e-graph as plain Python data (what extraction reads), from egglog's JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

from eqfuse.ir.ops import OPS

FACTS = ("rank", "dim", "dimn", "shape", "size", "sizen", "cval")
ANALYSES = ("orig", "hv", "vw", "nd")  # bookkeeping functions on classes, never e-nodes of the graph


def ctor_op(name: str) -> tuple[str, str]:
    """("T"|"S", op name) of a constructor name."""
    sort, op = ("T", name[2:]) if name.startswith("o_") else ("S", name[2:])
    return sort, op.split("__")[0]


@dataclass(frozen=True)
class ENode:
    id: int
    cls: int
    sort: str  # T | S
    kind: str  # In | Cn | K | L | Cs | op
    op: str = ""  # op name for kind "op"; the parameter name (In) or number text (Cn, Cs)
    children: tuple[int, ...] = ()  # class ids
    attrs: tuple[str, ...] = ()  # attribute texts, op-table order


@dataclass
class EData:
    """The e-graph as plain Python data: classes of e-nodes, with the facts extraction needs."""

    nodes: list[ENode]
    classes: dict[int, list[int]]  # class -> node ids
    sort: dict[int, str]
    orig: dict[int, int]  # class -> smallest original node id in it
    outputs: dict[int, int]  # output index -> class

    @staticmethod
    def from_json(j: dict) -> "EData":
        raw = j["nodes"]
        cls_ids: dict[str, int] = {}

        def cid(name: str) -> int:
            return cls_ids.setdefault(name, len(cls_ids))

        prim = {k: v["op"] for k, v in raw.items() if k.startswith("primitive")}
        prim_of_class = {v["eclass"]: k for k, v in raw.items() if k.startswith("primitive")}

        def pval(k: str) -> str:
            s = prim[k]
            return json.loads(s) if s.startswith('"') else s

        nodes: list[ENode] = []
        classes: dict[int, list[int]] = {}
        sort: dict[int, str] = {}
        orig: dict[int, int] = {}
        outputs: dict[int, int] = {}
        for k, v in raw.items():
            op, ch, ec = v["op"], v["children"], v["eclass"]
            if k.startswith("primitive"):
                continue
            if op == "orig":
                orig[cid(raw[ch[0]]["eclass"])] = int(pval(prim_of_class[ec]))
                continue
            if op == "Out":
                outputs[int(pval(ch[0]))] = cid(raw[ch[1]]["eclass"])
                continue
            if op in FACTS or op in ANALYSES:
                continue
            c = cid(ec)
            s = ec.split("-")[0]
            if op in ("In", "Cn", "Cs"):
                n = ENode(len(nodes), c, s, op, pval(ch[0]))
            elif op in ("K", "L"):
                n = ENode(len(nodes), c, s, op, "", (cid(raw[ch[0]]["eclass"]),))
            else:
                sort_, name = ctor_op(op)
                nattr = len(OPS[name].attrs)
                targs = ch[:len(ch) - nattr] if nattr else ch
                attrs = tuple(pval(x) for x in ch[len(ch) - nattr:]) if nattr else ()
                n = ENode(len(nodes), c, s, "op", name, tuple(cid(raw[x]["eclass"]) for x in targs), attrs)
            nodes.append(n)
            classes.setdefault(c, []).append(n.id)
            sort[c] = s
        return EData(nodes, classes, sort, orig, outputs)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_classes(self) -> int:
        return len(self.classes)
