"""`eqfuse opt --explain` and the report's `boundaries` / `fused_kernels` (eqfuse/optimizer/explain.py):
each reason on a graph that forces it."""

import json

import pytest

from eqfuse.cli.main import main
from eqfuse.frontend.load import load
from eqfuse.optimizer.explain import explain, printed_names
from eqfuse.optimizer.optimize import optimize_graph

MLP = "examples/mlp.g"
SHARED = """
graph shared(a: f32[64, 256], b: f32[64, 256], w: f32[256, 32]) -> (f32[64, 32], f32[64, 256]) {
    t = a + b
    return t @ w, relu(t)
}
"""


def opt(src, **kw):
    return optimize_graph(load(src)[0], **kw).report


def by_edge(report):
    return {(b["tensor"], b["to"]): b for b in report["boundaries"]}


def test_a_disabled_rule_is_no_rule_joins_the_two():
    assert ("k1", "h") not in by_edge(opt(MLP))
    b = by_edge(opt(MLP, disable=["fuse_add_l"]))[("k1", "h")]  # k1 = x @ w1 stored, h = relu(k1 + b1)
    assert b["reason"] == "no_rule"
    assert "fuse_add_l" in b["detail"]
    assert b["joined"]["bytes"] < b["stored"]["bytes"] and b["joined"]["kernels"] == 1


def test_an_unlowerable_join_names_the_kind_and_the_condition():
    b = by_edge(opt(MLP))[("h", "return")]  # relu(x @ w1 + b1) @ w2 + b2: two matmuls
    assert b["reason"] == "unlowerable" and b["kind"] == "mixed" and b["ops"] == ["matmul", "matmul"]
    assert "at most one non-pointwise op" in b["detail"]
    b = by_edge(opt(SHARED))[("t", "return[0]")]  # (a + b) @ w: a matmul operand computed in the kernel
    assert b["reason"] == "unlowerable" and b["kind"] == "contraction"
    assert b["detail"].startswith("the operands of matmul must be kernel inputs")
    assert "stored" not in b


def test_a_shared_intermediate_read_by_a_matmul_is_stored_by_the_cost_model():
    r = opt(SHARED)
    b = by_edge(r)[("t", "return[1]")]
    assert b["reason"] == "cost" and "recompute" in b["detail"]
    n = 64 * 256 * 4
    assert b["stored"]["bytes"] == 3 * n + 2 * n  # a + b writes t; relu reads t, writes its result
    assert b["joined"]["bytes"] == 3 * n + 3 * n  # t is still written for the matmul; relu(a + b) reads a and b
    assert b["stored"]["est_time_s"] < b["joined"]["est_time_s"]


def test_a_limit_that_stopped_the_search_is_named():
    r = opt(MLP, node_limit=5)
    assert r["stop_reason"] == "node_limit"
    limited = [b for b in r["boundaries"] if b["reason"] == "limit"]
    assert limited and all("node limit" in b["detail"] for b in limited)
    assert all(b["joined"]["bytes"] < b["stored"]["bytes"] for b in limited)


def test_every_fused_kernel_says_what_it_saves():
    fk = {f["kernel"]: f for f in opt(MLP)["fused_kernels"]}
    h = fk["h"]  # relu(x @ w1 + b1), B costed as 64: the matmul's and the add's results stay in registers
    assert h["ops"] == 3 and h["bytes_saved"] == 4 * 4 * 64 * 1024
    assert h["bytes_unfused"] - h["bytes"] == h["bytes_saved"]
    assert fk["return"]["ops"] == 2
    assert opt(SHARED)["fused_kernels"] == []


def test_views_are_not_boundaries_the_tensor_behind_them_is():
    r = opt("examples/transformer.g")
    edges = by_edge(r)
    assert not any(b["to"] in ("k2", "k4", "k6", "o") for b in r["boundaries"])  # the reshape views
    b = edges[("k1", "k7")]  # q projection -> attention, read through the head-split view k2
    assert b["through_views"] == ["k2"] and b["reason"] == "unlowerable"


def test_opt_explain_prints_every_boundary_and_saving(capsys, tmp_path):
    assert main(["opt", MLP, "--explain", "--disable", "fuse_add_l"]) == 0
    out = capsys.readouterr().out
    text = out[out.index("# boundaries of graph mlp"):]
    assert "#   k1 -> h (f32[B, 1024]): no rule joins the two" in text
    assert "#   h -> k2 (f32[B, 1024]): the backend cannot lower the joined body as a contraction kernel" in text
    assert "#   h: 2 ops, 0.528 MB instead of 1.053 MB, saves 0.524 MB" in text
    src = tmp_path / "shared.g"
    src.write_text(SHARED)
    assert main(["opt", str(src), "--explain"]) == 0
    out = capsys.readouterr().out
    assert ("#   t -> return[1] (f32[64, 256]): the cost model chose to store it: stored 0.328 MB, 2 kernels"
            in out) and "joined 0.393 MB, 2 kernels" in out
    assert main(["opt", MLP]) == 0
    assert "# boundaries" not in capsys.readouterr().out


def test_the_json_report_has_the_boundaries(capsys):
    assert main(["opt", MLP, "--report", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [b["reason"] for b in r["boundaries"]] == ["unlowerable"] and len(r["fused_kernels"]) == 2


def test_each_graph_of_a_file_gets_its_own_boundaries(capsys, tmp_path):
    src = tmp_path / "two.g"
    src.write_text(SHARED + """
graph solo(x: f32[8, 8]) -> f32[8, 8] {
    return relu(x + 1.0)
}
""")
    from eqfuse import optimize

    reports = optimize(src.read_text()).reports
    assert reports["solo"]["boundaries"] == [] and reports["solo"]["fused_kernels"][0]["ops"] == 2
    assert sorted(b["reason"] for b in reports["shared"]["boundaries"]) == ["cost", "unlowerable"]


@pytest.mark.parametrize("flag", ["--explain=yes"])
def test_explain_takes_no_value(capsys, flag):
    assert main(["opt", MLP, flag]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_past_the_time_limit_boundaries_are_listed_unexamined():
    from eqfuse.optimizer.explain import explain

    g = optimize_graph(load(MLP)[0], disable=["fuse_add_l"]).graph
    full = explain(g)["boundaries"]
    late = explain(g, deadline=0.0)["boundaries"]
    assert [(b["tensor"], b["to"]) for b in late] == [(b["tensor"], b["to"]) for b in full]
    assert all(b["reason"] == "limit" and b["detail"].startswith("not examined") for b in late)


def test_a_join_missed_by_an_extraction_not_proven_optimal_is_not_blamed_on_the_rules():
    from eqfuse.optimizer.explain import explain

    g = optimize_graph(load(MLP)[0], disable=["fuse_add_l"]).graph
    b = by_edge(explain(g, ilp="time_limit"))[("k1", "h")]
    assert b["reason"] == "limit" and "not proven optimal (ILP: time_limit)" in b["detail"]
    assert by_edge(explain(g, ilp="optimal", disabled=["fuse_add_l"]))[("k1", "h")]["reason"] == "no_rule"


def test_no_rule_is_a_lookup_in_the_egraph():
    # The consumer's e-class is searched for a kernel e-node computing the producer inside it.
    r = optimize_graph(load(MLP)[0], disable=["fuse_add_l"])
    b = by_edge(r.report)[("k1", "h")]
    assert b["reason"] == "no_rule" and b["joined_in_egraph"] is False
    assert "no e-node of the consumer's e-class joins them" in b["detail"]
    names = {v: k for k, v in printed_names(r.graph).items()}
    assert r.joins.holds_join(names["k1"], names["h"]) is False
    # ... which no longer depends on the extraction being proven optimal: the deduction from
    # "cheaper and not taken" could only say the e-graph may hold the join
    kw = dict(stop_reason="saturated", disabled=("fuse_add_l",), ilp="time limit")
    assert by_edge(explain(r.graph, **kw, joins=r.joins))[("k1", "h")]["reason"] == "no_rule"
    assert by_edge(explain(r.graph, **kw))[("k1", "h")]["reason"] == "limit"


def test_a_join_the_egraph_holds_is_found():
    # relu(a + b) is in relu(t)'s e-class (fuse_relu); the cost model stores t all the same
    r = optimize_graph(load(SHARED)[0])
    b = by_edge(r.report)[("t", "return[1]")]
    assert b["reason"] == "cost" and b["joined_in_egraph"] is True
    off = optimize_graph(load(SHARED)[0], disable=["fuse_relu"])
    assert by_edge(off.report)[("t", "return[1]")]["joined_in_egraph"] is False
    # two matmuls never share a kernel: no e-node joins them
    h = by_edge(opt(MLP))[("h", "return")]
    assert h["reason"] == "unlowerable" and h["joined_in_egraph"] is False


def test_graphs_of_one_file_look_up_their_own_egraph_classes(capsys, tmp_path):
    src = tmp_path / "two.g"
    src.write_text(SHARED + "\ngraph solo(x: f32[8, 8]) -> f32[8, 8] {\n    return relu(x + 1.0)\n}\n")
    from eqfuse import optimize

    reports = optimize(src.read_text()).reports
    assert by_edge(reports["shared"])[("t", "return[1]")]["joined_in_egraph"] is True


TWO = """
graph mlp(x: f32[B, 16], w: f32[16, 16], b: f32[16]) -> f32[B, 16] {
    return relu(x @ w + b)
}
graph attn(q: f32[S, 8], k: f32[S, 8], v: f32[S, 8]) -> f32[S, 8] {
    return softmax(q @ transpose(k) * 0.35) @ v
}
"""


def test_each_graphs_report_describes_that_graph_alone(capsys, tmp_path):
    # a file of two graphs: neither report names the other's rules or dims
    from eqfuse import optimize
    from eqfuse.optimizer.optimize import report_text

    src = tmp_path / "two.g"
    src.write_text(TWO)
    assert main(["opt", str(src), "--report", "json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    alone = {n: opt("graph " + TWO.split("graph ")[k])
             for k, n in ((1, "mlp"), (2, "attn"))}
    for name in ("mlp", "attn"):
        assert reports[name]["rules_fired"] == alone[name]["rules_fired"], name
    assert not any(r.startswith("attention") for r in reports["mlp"]["rules_fired"])
    assert list(reports["mlp"]["batch_dims"]) == ["B"] and list(reports["attn"]["batch_dims"]) == ["S"]
    # eqfuse.optimize: the same reports
    together = optimize(TWO).reports
    for name in ("mlp", "attn"):
        assert together[name]["rules_fired"] == alone[name]["rules_fired"], name
    assert list(together["mlp"]["batch_dims"]) == ["B"] and list(together["attn"]["batch_dims"]) == ["S"]
    assert "()" not in report_text(together["mlp"])


def test_in_a_file_of_many_graphs_each_report_lists_its_own_rules(capsys, tmp_path):
    # 17 MLPs (4 of them different, the others the same but their names) around one attention
    # graph: no MLP's report lists an attention rule, the attention graph's does
    mlps = [TWO.split("graph ")[1].replace("mlp(", f"mlp{i}(").replace("16", str(16 + 8 * (i % 4)))
            for i in range(17)]
    src = tmp_path / "many.g"
    src.write_text("".join("graph " + m for m in mlps[:9]) + "graph " + TWO.split("graph ")[2]
                   + "".join("graph " + m for m in mlps[9:]))
    assert main(["opt", str(src), "--report", "json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert len(reports) == 18 and list(reports)[9] == "attn"
    assert any(r.startswith("attention") for r in reports["attn"]["rules_fired"])
    for i in range(17):
        fired = reports[f"mlp{i}"]["rules_fired"]
        assert fired and not any(r.startswith("attention") for r in fired), (i, fired)
        assert fired == reports[f"mlp{i % 4}"]["rules_fired"]
        # a graph the same as an earlier one but its name: optimized once, and its report says so
        assert reports[f"mlp{i}"].get("same_as") == (f"mlp{i % 4}" if i >= 4 else None)
    assert reports["mlp5"]["graph"].startswith("graph mlp5(")
    assert reports["mlp1"]["rules_fired"] == opt("graph " + mlps[1])["rules_fired"]

BLOCK = """
graph blk(x: f32[B, 64], w1: f32[64, 128], b1: f32[128], g: f32[128], be: f32[128]) -> f32[B, 128] {
    return gelu(layernorm(x @ w1 + b1, g, be))
}
"""


@pytest.mark.parametrize("cost", ["memory", "launches", "time"])
def test_a_gemm_with_a_layernorm_and_gelu_epilogue_is_one_contraction_row_kernel(cost):
    # the join --explain once said the cost model rejected: one kernel, cheaper under every model
    from eqfuse.pipeline import lower

    r = optimize_graph(load(BLOCK)[0], cost=cost, dims={"B": 32})
    assert r.report["kernels_after"] == 1 and r.report["boundaries"] == []
    _, _, plans = lower(r.graph, {"B": 32})
    assert [p.kind for p in plans] == ["contraction_row"]


def test_explain_names_the_join_the_egraph_holds_only_when_it_is_the_one_estimated():
    # with the epilogue rule off, the e-graph holds gelu joined to a row kernel over the stored
    # GEMM, not to the GEMM-with-layernorm kernel extraction chose: not "held", no cost contradiction
    r = optimize_graph(load(BLOCK)[0], dims={"B": 32}, disable=["epilogue_layernorm_gelu"])
    (b,) = r.report["boundaries"]
    assert b["joined_in_egraph"] is False and b["reason"] == "no_rule", b


def test_run_and_lower_keep_hand_written_kernel_blocks(capsys, tmp_path, monkeypatch):
    import numpy as np

    import eqfuse

    src = tmp_path / "k.g"
    src.write_text("graph blk(x: f32[B, 64], w1: f32[64, 128], b1: f32[128]) -> f32[B, 128] {\n"
                   "    h = kernel { x @ w1 }\n    y = kernel { relu(h + b1) }\n    return y\n}\n")
    assert main(["lower", str(src), "--dim", "B=8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# graph blk: 2 kernels") and "contraction" in out and "pointwise" in out, out
    r = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", x=r.standard_normal((4, 64)).astype(np.float32),
             w1=r.standard_normal((64, 128)).astype(np.float32), b1=r.standard_normal(128).astype(np.float32))
    modes, real = [], eqfuse.compile
    monkeypatch.setattr(eqfuse, "compile", lambda *a, **k: modes.append(k.get("fuse")) or real(*a, **k))
    assert main(["run", str(src), "--inputs", str(tmp_path / "in.npz"), "--verify"]) == 0
    assert modes == ["manual"]
