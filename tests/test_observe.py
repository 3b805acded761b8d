"""Seeing what the device did: info(), metrics(), graph dumps, traces, dry runs and progress."""

from __future__ import annotations

import gc
import inspect
import itertools
import json
import os
import subprocess
import sys
import time
import warnings

import pydot
import pytest
import torch
from conftest import assert_close

import torch_nntile
from torch_nntile.backend import fallback as _fallback_mod

PHASES = {"record", "ingress", "fallback", "compile", "compile.reuse", "compile.axis_groups", "compile.lowering", "run",
          "replay", "wait", "readout"}
INFO_KEYS = {"phases", "tasks_submitted", "tasks_skipped", "ops_pruned", "compiles_reused", "compiles_lowered",
             "compiles_checked", "tiles_live", "tiles_peak", "tiles_registered", "tiles_spare", "tile_bytes", "bytes_in",
             "bytes_out", "out_of_core", "bytes_evicted", "bytes_loaded", "data_wait_s", "hint_evictions",
             "hint_evictions_declined", "dry_run", "mpi", "cuda"}

_groups = itertools.count()

# pydot (with pyparsing >= 3.3) builds its parser with deprecated pyparsing names
pytestmark = pytest.mark.filterwarnings("ignore:'setParseAction' deprecated:DeprecationWarning")


def _tiled(rows: int = 8, cols: int = 4, tile: int = 2, materialize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A CPU tensor and its nntile copy whose rows are tiled by ``tile`` (8 x 4 in 4 row tiles by default)."""
    x = torch.randn(rows, cols)
    xn = x.to("nntile")
    name = f"obs_rows_{next(_groups)}"
    torch_nntile.set_axis_group_name(xn, {0: name})
    torch_nntile.set_axis_group_tiling(name, tile)
    if materialize:
        torch_nntile.execute()
        torch_nntile.wait()
    return x, xn


def _flush() -> None:
    torch_nntile.execute()
    torch_nntile.wait()


def _line_of_next_statement() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


# -- DOT helpers -----------------------------------------------------------------


def _parse_dot(path) -> pydot.Dot:
    graphs = pydot.graph_from_dot_file(str(path))
    assert graphs is not None and len(graphs) == 1
    return graphs[0]


def _nodes(g: pydot.Dot, shape: str) -> dict[str, str]:
    """Node name -> label (unquoted) for nodes of one shape (skips 'node [...]' defaults)."""
    out = {}
    for n in g.get_nodes():
        if n.get_name() in ("node", "edge", "graph"):
            continue
        attrs = n.get_attributes()
        if attrs.get("shape") == shape:
            out[n.get_name()] = attrs.get("label", "").strip('"')
    return out


def _edges(g: pydot.Dot) -> list[tuple[str, str]]:
    return [(e.get_source(), e.get_destination()) for e in g.get_edges()]


# -- info ------------------------------------------------------------------------


def test_info_keys_and_reset_zeroes_everything_but_live_tiles():
    _x, xn = _tiled()
    torch_nntile.reset_info()
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    y.cpu()
    d = torch_nntile.info()
    assert set(d) == INFO_KEYS
    assert set(d["phases"]) == PHASES
    assert all(set(v) == {"calls", "seconds"} for v in d["phases"].values())
    assert d["tasks_submitted"] == 5 and d["bytes_out"] == 128  # mul+relu: 4 tiles; one readout task
    assert d["dry_run"] is None

    live = d["tiles_live"]
    assert live >= 12  # xn, m and y, 4 tiles each
    torch_nntile.reset_info()
    d = torch_nntile.info()
    for p, v in d["phases"].items():
        assert v == {"calls": 0, "seconds": 0.0}, p
    assert d["tasks_submitted"] == d["tasks_skipped"] == d["ops_pruned"] == d["bytes_in"] == d["bytes_out"] == 0
    assert d["tiles_live"] == live and d["tiles_peak"] == live
    m = torch_nntile.metrics()
    assert m["ops"] == {} and m["fallbacks"] == {} and m["kernels"] == {} and m["retiles"] == {}
    assert torch_nntile.fallback_counts() == {}
    del y, xn


def test_phase_calls_follow_compile_run_wait():
    _x, xn = _tiled()
    torch_nntile.reset_info()
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()

    def calls() -> dict[str, int]:
        return {p: v["calls"] for p, v in torch_nntile.info()["phases"].items()}

    assert calls() == dict.fromkeys(PHASES, 0) | {"record": 2}
    torch_nntile.compile_graph()
    reuse = calls()["compile.reuse"]  # the key, and the template when the structure was seen before
    assert reuse in (1, 2)
    assert calls() == dict.fromkeys(PHASES, 0) | {"record": 2, "compile": 1, "compile.reuse": reuse,
                                                  "compile.axis_groups": 1, "compile.lowering": 1}
    assert torch_nntile.info()["tasks_submitted"] == 0  # compiled, not submitted
    torch_nntile.run()
    assert calls()["run"] == 1 and calls()["wait"] == 0
    assert torch_nntile.info()["tasks_submitted"] == 4
    torch_nntile.wait()
    assert calls()["wait"] == 1
    d = torch_nntile.info()
    assert d["phases"]["compile"]["seconds"] >= (
        d["phases"]["compile.reuse"]["seconds"] + d["phases"]["compile.axis_groups"]["seconds"]
        + d["phases"]["compile.lowering"]["seconds"]
    )
    assert all(v["seconds"] > 0 for p, v in d["phases"].items() if v["calls"])
    del y


def test_phase_times_are_exclusive():
    """y.cpu() is one recorded ATen call that compiles, runs and reads out: the nested
    phases are not counted again under record, so the phase times add up to at most
    the wall time of the call."""
    _x, xn = _tiled(64, 32, 8)
    m = xn * 2  # held, as above
    r = m.relu()
    y = r.exp()
    torch_nntile.reset_info()
    t0 = time.perf_counter()
    y.cpu()
    wall = time.perf_counter() - t0
    ph = torch_nntile.info()["phases"]
    assert ph["compile.reuse"]["calls"] in (1, 2)  # the key, and the template when the structure was seen before
    assert {p: v["calls"] for p, v in ph.items() if v["calls"] and p != "compile.reuse"} == {
        "record": 1, "compile": 1, "compile.axis_groups": 1, "compile.lowering": 1, "run": 1, "wait": 1, "readout": 1,
    }
    assert all(v["seconds"] >= 0 for v in ph.values())
    total = sum(v["seconds"] for p, v in ph.items() if not p.startswith("compile."))  # compile includes these
    assert total <= wall + 1e-9  # nested phases are not counted twice


def test_format_info_and_print_info(capsys):
    torch_nntile.reset_info()
    x = torch.randn(100, 100)
    xn = x.to("nntile")  # 40000 bytes in
    assert_close((xn + 1).cpu(), x + 1)
    text = torch_nntile.format_info()
    d = torch_nntile.info()
    lines = text.splitlines()
    assert lines[0].split() == ["phase", "calls", "total", "s", "ms/call"]
    assert not text.startswith("!!")  # no dry run
    for label in ("record", "ingress", "CPU fallback ops", "compile", "axis groups", "lowering to tile tasks",
                  "run (submit to StarPU)", "wait", "readout (copies to CPU)"):
        assert any(ln.lstrip().startswith(label) for ln in lines), label
    ing = next(ln for ln in lines if ln.startswith("ingress"))
    assert ing.split()[-3] == "1"  # calls
    fb = next(ln for ln in lines if ln.startswith("CPU fallback ops"))
    assert fb.split()[-3:] == ["0", "0.0000", "-"]
    assert f"tasks submitted: {d['tasks_submitted']}" in lines
    assert (f"tiles live: {d['tiles_live']}, peak {d['tiles_peak']}; new StarPU handles: {d['tiles_registered']}, "
            f"spare handles kept for reuse: {d['tiles_spare']}") in lines
    assert "bytes in: 0.04 MB, out: 0.04 MB" in lines
    torch_nntile.print_info()
    assert capsys.readouterr().out == torch_nntile.format_info() + "\n"


def test_bytes_in_and_out():
    torch_nntile.reset_info()
    a = torch.randn(8, 4).to("nntile")  # 128 bytes
    b = torch.arange(3).to("nntile")  # int64: 24 bytes
    c = torch.randn(5).to("nntile", dtype=torch.float64)  # converted on the CPU, then moved: 40 bytes
    assert torch_nntile.info()["bytes_in"] == 128 + 24 + 40
    assert torch_nntile.info()["bytes_out"] == 0
    a.cpu()
    assert torch_nntile.info()["bytes_out"] == 128
    a[:2].cpu()  # a view: 2 x 4 float32
    b.cpu()
    assert torch_nntile.info()["bytes_out"] == 128 + 32 + 24
    c.sum().item()  # one float64
    assert torch_nntile.info()["bytes_out"] == 128 + 32 + 24 + 8
    assert torch_nntile.info()["bytes_in"] == 128 + 24 + 40


def test_tiles_live_and_peak():
    torch_nntile.execute()
    torch_nntile.wait()
    gc.collect()
    torch_nntile.reset_info()
    base = torch_nntile.info()["tiles_live"]
    assert torch_nntile.info()["tiles_peak"] == base
    _x, xn = _tiled()  # 4 tiles
    assert torch_nntile.info()["tiles_live"] == base + 4
    y = xn * 2
    torch_nntile.execute()
    torch_nntile.wait()
    d = torch_nntile.info()
    assert d["tiles_live"] == base + 8
    assert d["tiles_peak"] >= d["tiles_live"]
    del y
    assert torch_nntile.info()["tiles_live"] == base + 4
    del xn
    d = torch_nntile.info()
    assert d["tiles_live"] == base
    assert d["tiles_peak"] == base + 8
    torch_nntile.reset_info()
    assert torch_nntile.info()["tiles_peak"] == base  # the peak restarts from the live tiles


# -- metrics ---------------------------------------------------------------------


def test_metrics_ops_count_recorded_calls():
    _x, xn = _tiled()
    torch_nntile.reset_info()
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    assert torch_nntile.metrics()["ops"] == {"aten::mul.Tensor": 1, "aten::relu": 1}
    assert torch_nntile.metrics()["kernels"] == {}  # nothing ran yet
    y.add_(1)
    y.cpu()
    assert torch_nntile.metrics()["ops"] == {
        "aten::mul.Tensor": 1, "aten::relu": 1, "aten::add_.Tensor": 1, "aten::_to_copy": 1,
    }
    report = torch_nntile.metrics_report()
    rows = {ln.split()[0]: ln.split()[1] for ln in report.splitlines() if ln.startswith("aten::")}
    assert rows == {"aten::mul.Tensor": "1", "aten::relu": "1", "aten::add_.Tensor": "1", "aten::_to_copy": "1"}


def test_kernel_tasks_match_tasks_submitted():
    torch_nntile.reset_info()
    x, xn = _tiled(materialize=False)  # ingress pending: 4 tasks
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    assert_close(y.cpu(), (x * 2).relu())
    d, m = torch_nntile.info(), torch_nntile.metrics()
    assert {k: v["tasks"] for k, v in m["kernels"].items()} == {"ingress": 4, "mul+relu": 4, "readout": 1}
    assert d["tasks_submitted"] == 9 == sum(v["tasks"] for v in m["kernels"].values())
    assert all(v["seconds"] > 0 for v in m["kernels"].values())
    lines = torch_nntile.metrics_report().splitlines()
    assert lines[0].split() == ["ATen", "op", "calls"]
    head = next(i for i, ln in enumerate(lines) if ln.startswith("tile kernel"))
    rows = [ln.split() for ln in lines[head + 1:]]
    assert sorted(r[0] for r in rows) == ["ingress", "mul+relu", "readout"]
    assert all(r[1] == ("1" if r[0] == "readout" else "4") for r in rows)
    shares = [float(r[-1].rstrip("%")) for r in rows]
    assert abs(sum(shares) - 100) < 0.5
    secs = [float(r[2]) for r in rows]
    assert secs == sorted(secs, reverse=True)  # slowest kernel first


def test_cpu_fallback_counted_with_first_source(monkeypatch):
    monkeypatch.delenv("TORCH_NNTILE_DEBUG", raising=False)
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    torch_nntile.reset_info()
    x = torch.rand(6) + 0.5
    xn = x.to("nntile")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning without TORCH_NNTILE_DEBUG
        line = _line_of_next_statement()
        a = torch.logcumsumexp(xn, 0)
        b = torch.logcumsumexp(a * 2, 0)
    assert_close(b.cpu(), torch.logcumsumexp(torch.logcumsumexp(x, 0) * 2, 0))
    fb = torch_nntile.metrics()["fallbacks"]
    assert set(fb) == {"aten::_logcumsumexp"}
    assert fb["aten::_logcumsumexp"]["count"] == 2
    path, _, lineno = fb["aten::_logcumsumexp"]["first_source"].rpartition(":")
    assert os.path.samefile(path, __file__) and int(lineno) == line
    assert torch_nntile.fallback_counts() == {"aten::_logcumsumexp": 2}
    ops = torch_nntile.metrics()["ops"]
    assert sum(n for k, n in ops.items() if k.startswith("aten::_logcumsumexp")) == 2
    assert torch_nntile.info()["phases"]["fallback"]["calls"] == 2
    report = torch_nntile.metrics_report()
    fallback_rows = report.split("ran on the CPU fallback")[1].splitlines()
    row = next(ln for ln in fallback_rows if ln.split() and ln.split()[0] == "aten::_logcumsumexp")
    assert row.split()[1] == "2" and row.split()[2] == f"{path}:{line};"
    assert fb["aten::_logcumsumexp"]["reason"] == "PyTorch gives it no Meta kernel"
    assert row.endswith("; PyTorch gives it no Meta kernel")


def test_untiled_ops_listed_with_first_source_and_bytes():
    """An op with no tiled kernel but a Meta kernel runs as an untiled task, listed
    with its calls, the bytes it read whole and its first call's line."""
    torch_nntile.init_context(ncpu=2, cpu_fallback=False)
    torch_nntile.reset_info()
    x = torch.randn(6, 5)
    xn = x.to("nntile")
    line = _line_of_next_statement()
    a = torch.special.bessel_j0(xn)
    b = torch.special.bessel_j0(a[:3])
    assert_close(b.cpu(), torch.special.bessel_j0(torch.special.bessel_j0(x)[:3]))
    m = torch_nntile.metrics()
    assert m["fallbacks"] == {}
    u = m["untiled"]["aten::special_bessel_j0.out"]
    assert u["count"] == 2 and u["bytes_gathered"] == (30 + 15) * 4
    path, _, lineno = u["first_source"].rpartition(":")
    assert os.path.samefile(path, __file__) and int(lineno) == line
    rows = torch_nntile.metrics_report().split("ran as untiled tasks")[1].splitlines()
    row = next(ln for ln in rows if ln.split() and ln.split()[0] == "aten::special_bessel_j0.out")
    assert row.split()[1:] == ["2", "180", "B", f"{path}:{line}"]


def test_debug_env_warns_once_per_op(monkeypatch):
    monkeypatch.setenv("TORCH_NNTILE_DEBUG", "1")
    monkeypatch.setattr(_fallback_mod, "_WARNED", set())
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    torch_nntile.reset_info()
    x = torch.randn(5)
    xn = x.to("nntile")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line_of_next_statement()
        s = torch.logcumsumexp(xn, 0)
        s = torch.logcumsumexp(s, 0)
        c = torch.special.bessel_j1(s)  # an untiled task: no warning
        c = torch.unique_consecutive((c > 0).int())
        c = torch.unique_consecutive(c)
    ours = [w for w in caught if "torch_nntile" in str(w.message)]
    assert [w.category for w in ours] == [RuntimeWarning, RuntimeWarning]
    msgs = [str(w.message) for w in ours]
    assert "aten::_logcumsumexp" in msgs[0] and f"test_observe.py:{line}" in msgs[0]
    assert "PyTorch gives it no Meta kernel" in msgs[0]
    assert "aten::unique_consecutive" in msgs[1] and f"test_observe.py:{line + 3}" in msgs[1]
    assert "the shape of its results depends on the values" in msgs[1]
    assert os.path.samefile(ours[0].filename, __file__) and ours[0].lineno == line
    assert torch_nntile.fallback_counts() == {"aten::_logcumsumexp": 2, "aten::unique_consecutive": 2}
    want = torch.special.bessel_j1(torch.logcumsumexp(torch.logcumsumexp(x, 0), 0))
    assert_close(c.cpu(), torch.unique_consecutive(torch.unique_consecutive((want > 0).int())))


# -- pending graph and dumps -----------------------------------------------------


def test_pending_op_names_and_data_sizes():
    torch_nntile.reset_info()
    x = torch.randn(8, 4)
    xn = x.to("nntile")
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    m = xn > 0
    assert torch_nntile.pending_op_names() == ["ingress", "mul", "relu", "gt"]
    lines = torch_nntile.format_pending_data_sizes().splitlines()
    assert lines[0].split() == ["op", "shape", "dtype", "bytes"]
    rows = [ln.split() for ln in lines[1:-1]]
    assert [(r[0], " ".join(r[1:3]), r[3], int(r[4])) for r in rows] == [
        ("ingress", "[8, 4]", "float32", 128), ("mul", "[8, 4]", "float32", 128),
        ("relu", "[8, 4]", "float32", 128), ("gt", "[8, 4]", "bool", 32),
    ]
    assert lines[-1] == "total: 4 values, 416 bytes (416 B)"
    torch_nntile.compile_graph()
    assert torch_nntile.pending_op_names() == []
    assert torch_nntile.format_pending_data_sizes().splitlines()[-1] == "total: 0 values, 0 bytes (0 B)"
    torch_nntile.run()
    torch_nntile.wait()
    assert torch.equal(m.cpu(), x > 0)
    del y


def test_long_recordings_are_submitted_as_they_grow():
    """Once FLUSH_OPS ops are pending, recording lowers and submits them and goes on
    (the workers start on them meanwhile): a read-back then finds only the rest
    pending, and every value is what it would have been."""
    from torch_nntile.session import FLUSH_OPS
    torch_nntile.execute()
    x = torch.randn(6, 5)
    xn = x.to("nntile")
    want, got = x, xn
    for i in range(FLUSH_OPS + 10):
        want, got = want * 0.999 + 0.001 * i, got * 0.999 + 0.001 * i
    assert 0 < len(torch_nntile.pending_op_names()) < FLUSH_OPS
    assert_close(got.cpu(), want)


def test_dump_graph_tensor_level(tmp_path):
    _x, xn = _tiled()
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    path = tmp_path / "g.dot"
    torch_nntile.dump_graph(path)
    g = _parse_dot(path)
    ops = _nodes(g, "ellipse")
    values = _nodes(g, "box")
    assert sorted(ops.values()) == ["mul", "relu"]
    assert len(values) == 3
    assert all(r"[8, 4] float32\ntiles 2|2|2|2x4" in lab for lab in values.values())
    grey = [n for n in g.get_nodes() if n.get_attributes().get("fillcolor") == "lightgrey"]
    assert len(grey) == 1 and "materialized" in grey[0].get_attributes()["label"]
    edges = _edges(g)
    assert len(edges) == 4
    mul = next(k for k, v in ops.items() if v == "mul")
    relu = next(k for k, v in ops.items() if v == "relu")
    (x_box,) = [s for s, d in edges if d == mul]
    (mid,) = [d for s, d in edges if s == mul]
    (out,) = [d for s, d in edges if s == relu]
    assert x_box == grey[0].get_name()
    assert (mid, relu) in edges and len({x_box, mid, out}) == 3
    assert torch_nntile.pending_op_names() == ["mul", "relu"]  # dumping changes nothing
    _flush()
    del y


def test_dump_graph_tile_level(tmp_path):
    _x, xn = _tiled()
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    before = torch_nntile.info()
    path = tmp_path / "t.dot"
    torch_nntile.dump_graph(path, level="tile")
    g = _parse_dot(path)
    tasks = _nodes(g, "ellipse")
    tiles = _nodes(g, "box")
    assert sorted(tasks.values()) == ["mul"] * 4 + ["relu"] * 4
    assert len(tiles) == 12  # 4 tiles each of x, x * 2 and relu(x * 2)
    assert all(r"[2, 4] v0" in lab for lab in tiles.values())
    edges = _edges(g)
    assert len(edges) == 16
    for k, name in tasks.items():
        ins = [s for s, d in edges if d == k]
        outs = [d for s, d in edges if s == k]
        assert len(ins) == 1 and len(outs) == 1
        if name == "relu":  # reads exactly the tile one mul task wrote
            assert sum(1 for s, d in edges if d == ins[0] and tasks.get(s) == "mul") == 1
    # nothing was compiled or run by dumping
    after = torch_nntile.info()
    assert torch_nntile.pending_op_names() == ["mul", "relu"]
    assert after["tasks_submitted"] == before["tasks_submitted"]
    assert after["phases"]["compile"]["calls"] == before["phases"]["compile"]["calls"]
    assert after["tiles_live"] == before["tiles_live"]
    _flush()
    del y


def test_dump_graph_tile_level_includes_compiled_tasks(tmp_path):
    _x, xn = _tiled(materialize=False)
    y = xn * 2
    torch_nntile.compile_graph()
    z = y.relu()
    path = tmp_path / "t.dot"
    torch_nntile.dump_graph(path, level="tile")
    g = _parse_dot(path)
    assert sorted(_nodes(g, "ellipse").values()) == ["ingress"] * 4 + ["mul"] * 4 + ["relu"] * 4
    assert len(_nodes(g, "box")) == 12
    assert len(_edges(g)) == 4 + 8 + 8
    torch_nntile.run()
    torch_nntile.wait()
    del y, z


def test_dump_graph_tile_level_versions_of_a_reduction(tmp_path):
    """x.sum(0) over 4 row tiles accumulates into one output tile: each write of it is a
    new box (v0, v1, ...), read by the task that writes the next version."""
    x, xn = _tiled()
    total = xn.sum(0)
    path = tmp_path / "sum.dot"
    torch_nntile.dump_graph(path, level="tile")
    g = _parse_dot(path)
    tasks, tiles, edges = _nodes(g, "ellipse"), _nodes(g, "box"), _edges(g)
    assert set(tasks.values()) == {"sum"} and len(tasks) >= 4
    out = {int(v.rsplit(" v", 1)[1]): k for k, v in tiles.items() if v.startswith("sum [4] tile [0]")}
    assert sorted(out) == list(range(len(out))) and len(out) >= 2
    writer = {dst: src for src, dst in edges if src in tasks}
    readers: dict[str, list[str]] = {}
    for src, dst in edges:
        if dst in tasks:
            readers.setdefault(src, []).append(dst)
    for v in range(1, len(out)):
        assert writer[out[v]] in readers[out[v - 1]]
    assert out[len(out) - 1] not in readers  # the result: nothing reads it
    inputs = [k for k, v in tiles.items() if v.startswith("value [8, 4]")]
    assert len(inputs) == 4 and all(len(readers[k]) == 1 for k in inputs)
    before = torch_nntile.info()["tasks_submitted"]
    _flush()
    assert torch_nntile.info()["tasks_submitted"] - before == len(tasks)  # the dump shows what runs
    assert_close(total.cpu(), x.sum(0))


def test_dump_graph_tile_names_of_compiled_values(tmp_path):
    _x, xn = _tiled()
    y = xn * 2
    path = tmp_path / "pending.dot"
    torch_nntile.dump_graph(path, level="tile")
    pending_labels = sorted(_nodes(_parse_dot(path), "box").values())
    assert sum(lab.startswith("mul [8, 4] tile") for lab in pending_labels) == 4
    torch_nntile.compile_graph()
    path = tmp_path / "compiled.dot"
    torch_nntile.dump_graph(path, level="tile")
    compiled_labels = sorted(_nodes(_parse_dot(path), "box").values())
    torch_nntile.run()
    torch_nntile.wait()
    del y
    assert compiled_labels == pending_labels  # the same tasks, the same tiles: the same names


def test_dump_graph_tile_level_leaves_counters_alone(tmp_path):
    _x, xn = _tiled()
    y = xn * 2
    torch_nntile.reset_info()
    before = torch_nntile.info()
    torch_nntile.dump_graph(tmp_path / "t.dot", level="tile")
    after = torch_nntile.info()
    _flush()
    del y
    assert after["tiles_live"] == before["tiles_live"]
    assert after["tiles_peak"] == before["tiles_peak"]  # no tile was ever live beyond the 4 of xn


def test_dump_graph_bad_level(tmp_path):
    x = torch.randn(3).to("nntile")
    path = tmp_path / "bad.dot"
    with pytest.raises(ValueError, match="level must be 'tensor' or 'tile', got 'task'"):
        torch_nntile.dump_graph(path, level="task")
    assert not path.exists()
    _flush()
    del x


def test_dump_graph_of_nothing_pending(tmp_path):
    torch_nntile.execute()
    torch_nntile.wait()
    for level in ("tensor", "tile"):
        path = tmp_path / f"{level}.dot"
        torch_nntile.dump_graph(path, level=level)
        g = _parse_dot(path)
        assert _nodes(g, "ellipse") == {} and _nodes(g, "box") == {} and _edges(g) == []


def test_dump_graph_env_var_writes_a_file_per_compile(tmp_path, monkeypatch):
    folder = tmp_path / "dumps"
    monkeypatch.setenv("TORCH_NNTILE_DUMP_GRAPH", str(folder))
    _x, xn = _tiled()  # flushed once with the env var set: the ingress
    assert len(list(folder.iterdir())) == 1
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    torch_nntile.compile_graph()
    files = sorted(folder.iterdir())
    assert len(files) == 2
    g = _parse_dot(files[1])
    assert sorted(_nodes(g, "ellipse").values()) == ["mul", "relu"]
    assert len(_nodes(g, "box")) == 3 and len(_edges(g)) == 4
    assert sorted(_nodes(_parse_dot(files[0]), "ellipse").values()) == ["ingress"]
    torch_nntile.compile_graph()  # nothing pending: no file
    torch_nntile.run()
    torch_nntile.wait()
    y.cpu()  # materialized: no compile of anything
    assert len(list(folder.iterdir())) == 2
    assert all(p.name.startswith(f"graph_{os.getpid()}_") and p.suffix == ".dot" for p in files)


# -- traces ----------------------------------------------------------------------


def _check_trace(path) -> tuple[list[dict], list[dict]]:
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    tasks = [e for e in events if e.get("cat") == "task"]
    phases = [e for e in events if e.get("cat") == "phase"]
    assert len(tasks) + len(phases) + sum(e["ph"] == "M" for e in events) == len(events)
    for e in tasks:
        assert e["ph"] == "X" and e["pid"] == 1 and isinstance(e["tid"], int)
        assert e["ts"] >= 0 and e["dur"] >= 0 and set(e["args"]) == {"task"}
    for e in phases:
        assert e["ph"] == "X" and e["pid"] == 0 and e["ts"] >= 0 and e["dur"] >= 0
        assert e["name"] in PHASES
    keys = [e["args"]["task"] for e in tasks]
    assert len(set(keys)) == len(keys)  # each task once
    named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1}
    assert {e["tid"] for e in tasks} <= named
    for tid in {e["tid"] for e in tasks}:  # a worker runs one task at a time
        mine = sorted((e for e in tasks if e["tid"] == tid), key=lambda e: e["ts"])
        for a, b in itertools.pairwise(mine):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-3, (a, b)
    return tasks, phases


def test_trace_records_every_task_once(tmp_path):
    x, xn = _tiled(materialize=False)
    torch_nntile.reset_info()
    path = tmp_path / "trace.json"
    with torch_nntile.trace(path):
        m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
        y = m.relu()
        assert_close(y.cpu(), (x * 2).relu())
    tasks, phases = _check_trace(path)
    assert len(tasks) == torch_nntile.info()["tasks_submitted"] == 9
    assert sorted(e["name"] for e in tasks) == sorted(["ingress", "mul+relu"] * 4 + ["readout"])
    # ts and dur are microseconds of the same clock as the kernel and phase statistics
    # (equal but for the rounding of seconds-since-boot doubles: 1 ns allowed)
    m = torch_nntile.metrics()["kernels"]
    for name in ("ingress", "mul+relu", "readout"):
        dur = sum(e["dur"] for e in tasks if e["name"] == name)
        assert dur == pytest.approx(m[name]["seconds"] * 1e6, rel=1e-6, abs=1e-3)
    names = [e["name"] for e in phases]
    for p in ("record", "compile", "compile.axis_groups", "compile.lowering", "run", "readout"):
        assert p in names, p
    (low,) = [e for e in phases if e["name"] == "compile.lowering"]
    (comp,) = [e for e in phases if e["name"] == "compile"]
    assert low["dur"] == pytest.approx(torch_nntile.info()["phases"]["compile.lowering"]["seconds"] * 1e6, rel=1e-6,
                                      abs=1e-3)
    assert comp["ts"] <= low["ts"] and low["ts"] + low["dur"] <= comp["ts"] + comp["dur"] + 1e-3
    # tasks start after they are submitted and end before the readout returns
    (run,) = [e for e in phases if e["name"] == "run"]
    (readout,) = [e for e in phases if e["name"] == "readout"]
    assert min(e["ts"] for e in tasks) >= run["ts"]
    assert max(e["ts"] + e["dur"] for e in tasks) <= readout["ts"] + readout["dur"] + 1e-3
    assert min(e["ts"] for e in tasks + phases) == 0


def test_readout_runs_before_work_queued_ahead_of_it(tmp_path):
    """A read-back of a value that is ready is not queued behind the products submitted
    before it (its task has the highest priority): it starts before most of them."""
    a = torch.randn(512, 512).to("nntile")  # products of a few ms: most are still queued at the read-back
    small = torch.randn(4)
    s = small.to("nntile") * 3
    torch_nntile.execute()
    torch_nntile.wait()
    path = tmp_path / "t.json"
    with torch_nntile.trace(path):
        ys = [a @ a for _ in range(40)]
        torch_nntile.execute()
        assert_close(s.cpu(), small * 3)
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "task"]
    (readout,) = [e["ts"] for e in events if e["name"] == "readout"]
    products = [e["ts"] for e in events if e["name"] == "mm"]
    assert len(products) == 40 and len(ys) == 40
    assert sum(t > readout for t in products) >= 20, (readout, sorted(products))


def test_native_product_tasks_are_counted_and_traced(tmp_path):
    """Product tiles run in C (no Python callback) still show up in metrics, in the
    progress count and in traces, once each, with matching durations."""
    _x, xn = _tiled(rows=8, cols=6, tile=2)  # 4 row tiles
    w = torch.randn(5, 6).to("nntile")
    _flush()
    torch_nntile.reset_info()
    rt = torch_nntile.session.SESSION_STATE.runtime()
    done0 = rt.tasks_done()
    path = tmp_path / "mm.json"
    with torch_nntile.trace(path):
        y = xn @ w.t()  # 4 output tiles, one product task each
        torch_nntile.execute()
    tasks, _ = _check_trace(path)
    mm = [e for e in tasks if e["name"] == "mm"]
    k = torch_nntile.metrics()["kernels"]["mm"]
    assert len(mm) == k["tasks"] == 4
    assert sum(e["dur"] for e in mm) == pytest.approx(k["seconds"] * 1e6, rel=1e-3, abs=4e-3)
    assert rt.tasks_done() - done0 == torch_nntile.info()["tasks_submitted"] == len(tasks)
    assert_close(y.cpu(), _x @ w.cpu().t())


def test_start_stop_trace_counts_and_stops(tmp_path):
    _x, xn = _tiled()
    torch_nntile.start_trace()
    y = xn * 2
    torch_nntile.execute()
    n1 = torch_nntile.stop_trace(tmp_path / "a.json")  # waits for the submitted tasks
    assert n1 == 4
    z = y + 1  # not traced
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.start_trace()
    w = z.relu()
    torch_nntile.execute()
    n2 = torch_nntile.stop_trace(tmp_path / "b.json")
    assert n2 == 4
    a, _ = _check_trace(tmp_path / "a.json")
    b, _ = _check_trace(tmp_path / "b.json")
    assert [e["name"] for e in a] == ["mul"] * 4 and [e["name"] for e in b] == ["relu"] * 4
    assert not {e["args"]["task"] for e in a} & {e["args"]["task"] for e in b}
    del w


def test_trace_written_when_block_raises(tmp_path):
    _x, xn = _tiled()
    path = tmp_path / "t.json"
    with pytest.raises(ZeroDivisionError), torch_nntile.trace(path):
        y = xn * 3
        torch_nntile.execute()
        1 / 0  # noqa: B018
    tasks, _ = _check_trace(path)
    assert [e["name"] for e in tasks] == ["mul"] * 4
    del y


# -- progress --------------------------------------------------------------------


def _recorder() -> tuple[list[tuple[int, int]], object]:
    calls: list[tuple[int, int]] = []
    return calls, lambda done, total: calls.append((done, total))


def _check_progress(calls: list[tuple[int, int]], total: int) -> None:
    assert calls, "progress was never called"
    assert calls[-1] == (total, total)
    assert all(t == total and 0 <= d <= t for d, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_progress_run_then_wait():
    _x, xn = _tiled(64, 4, 2)  # 32 tiles
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    torch_nntile.compile_graph()
    calls, cb = _recorder()
    before = torch_nntile.info()["tasks_submitted"]
    torch_nntile.run(progress=cb)
    assert calls == []  # reported by wait()
    torch_nntile.wait()
    total = torch_nntile.info()["tasks_submitted"] - before
    assert total == 32
    _check_progress(calls, total)
    n = len(calls)
    torch_nntile.execute()
    torch_nntile.wait()
    assert len(calls) == n  # the callback was for one wait only
    del y


def test_progress_wait_argument_and_readout():
    _x, xn = _tiled()
    y = xn * 2
    torch_nntile.execute()
    calls, cb = _recorder()
    torch_nntile.wait(progress=cb)
    _check_progress(calls, 4)
    # run(progress=...) then a readout: the readout's wait reports it
    z = y.relu()
    calls, cb = _recorder()
    torch_nntile.execute(progress=cb)
    z.cpu()
    _check_progress(calls, 4)
    torch_nntile.wait()  # the readout task itself was submitted after that wait
    # nothing submitted: one call, (0, 0)
    calls, cb = _recorder()
    torch_nntile.wait(progress=cb)
    assert calls == [(0, 0)]


def test_progress_bar_on_stderr(capsys):
    _x, xn = _tiled()
    m = xn * 2  # held: written by its reader's tasks too (one task per tile for both ops)
    y = m.relu()
    torch_nntile.compile_graph()
    torch_nntile.run(progress=True)
    torch_nntile.wait()
    err = capsys.readouterr().err
    assert err.startswith("\rtorch_nntile [")
    assert err.endswith(f"[{'#' * 30}] 4/4 tasks\n")
    assert err.count("\n") == 1
    del y


# -- dry runs (switches are read at init_context: a fresh process each) ----------


_DRY_RUN = """
import json, warnings
import torch, torch.nn.functional as F, torch_nntile
torch_nntile.init_context(ncpu=2)
x = torch.arange(32, dtype=torch.float32).reshape(8, 4) + 1
xn = x.to("nntile")
torch_nntile.set_axis_group_name(xn, {0: "rows"})
torch_nntile.set_axis_group_tiling("rows", 2)
m = xn * 2  # held: written by the fused task too
y = m.relu()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = y.cpu()
ours = [w for w in caught if w.category is RuntimeWarning]
res = {"out": out.tolist(), "warnings": [str(w.message) for w in ours],
       "where": [(w.filename, w.lineno) for w in ours],
       "info": torch_nntile.info(), "text": torch_nntile.format_info(),
       "kernels": {k: v["tasks"] for k, v in torch_nntile.metrics()["kernels"].items()},
       "report": torch_nntile.metrics_report()}
bad = F.nll_loss(torch.randn(4, 3).to("nntile"), torch.tensor([0, 1, 7, 2]).to("nntile"))  # raises if run
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad.cpu()
    res["kernel_error"] = None
except torch_nntile.KernelError as e:
    res["kernel_error"] = str(e)
torch_nntile.shutdown_context()
print(json.dumps(res))
"""


_DRY_RESULTS: dict[str, dict] = {}


def _dry_run(switch: str) -> dict:
    """Run the script once per switch in a fresh process (cached for the tests below)."""
    if switch not in _DRY_RESULTS:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NNTILE_")}
        env.update({switch: "1", "STARPU_SILENT": "1"})
        proc = subprocess.run([sys.executable, "-c", _DRY_RUN], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        _DRY_RESULTS[switch] = json.loads(proc.stdout.splitlines()[-1])
    return _DRY_RESULTS[switch]


@pytest.mark.parametrize("switch", ["TORCH_NNTILE_SKIP_STARPU", "TORCH_NNTILE_SKIP_KERNELS"])
def test_dry_run_switch(switch):
    res = _dry_run(switch)
    assert res["out"] == [[0.0] * 4] * 8  # zeros, not 2 * x
    assert len(res["warnings"]) == 1
    assert switch in res["warnings"][0] and "zeros, not results" in res["warnings"][0]
    d = res["info"]
    assert d["dry_run"] == switch
    assert d["bytes_in"] == 128 and d["bytes_out"] == 128
    assert d["phases"]["compile"]["calls"] == 1 and d["phases"]["readout"]["calls"] == 1
    lines = res["text"].splitlines()
    assert lines[0] == f"!! {switch} is set: timings only, results are not numerically meaningful"
    assert res["report"].splitlines()[0] == f"!! {switch} is set: kernel times are not real"
    assert res["kernel_error"] is None  # the failing kernel never ran
    if switch == "TORCH_NNTILE_SKIP_STARPU":  # recorded and compiled, nothing submitted
        assert d["tasks_submitted"] == 0 and d["tasks_skipped"] == 8  # ingress, mul+relu: 4 each
        assert res["kernels"] == {}
        assert "tasks submitted: 0 (8 not submitted: dry run)" in lines
    else:  # submitted, kernels skipped (readout submits nothing: there is nothing to read)
        assert d["tasks_submitted"] == 8 and d["tasks_skipped"] == 0
        assert res["kernels"] == {"ingress": 4, "mul+relu": 4}
        assert "tasks submitted: 8" in lines


def test_dry_run_warning_points_at_user_code():
    res = _dry_run("TORCH_NNTILE_SKIP_KERNELS")
    line = _DRY_RUN.splitlines().index("    out = y.cpu()") + 1
    assert res["where"] == [["<string>", line]]
