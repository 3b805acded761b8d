"""benchmarks/mlp_step.py, gpt2_step.py and cnn_step.py: their multiply-add counts match what PyTorch's
flop counter sees in an eager step, and each runs with tiny settings in a fresh
interpreter and prints every figure line in a form that parses, its quotients those of
the figures printed (no timing asserted), and writes the same figures with ``--json``.
The runs with the peak memory start three interpreters each (the timed one and one per
side), so they are marked slow.

benchmarks/mpi_step.py (where mpirun and StarPU-MPI are) runs over 1 and 2 processes with
tiny settings and writes a run per process count, 2 ranks sending tiles and 1 none.

benchmarks/report_pages.py: synthetic results give the table's numbers and the plots,
the same bytes twice, results of several processes in the page's second generated part;
``--check`` passes on the committed docs/benchmarks.md and fails on an edited copy."""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import cnn_step  # noqa: E402
import gpt2_step  # noqa: E402
import mlp_step  # noqa: E402
import report_pages  # noqa: E402

import torch_nntile  # noqa: E402

ROOT = BENCH.parent

NUM = r"([0-9]+(?:\.[0-9]+)?)"
FIGURES = {  # line -> pattern its numbers must match
    "floor": rf"^floor ms: {NUM} \(",
    "nntile/floor": rf"^nntile/floor: {NUM}$",
    "best floor": rf"^floor at the best of 10 products before the steps: {NUM} ms \({NUM} GMAC/s; "
                  rf"nntile/floor {NUM}, cpu/floor {NUM}\)$",
    "rss": rf"^peak rss MiB: cpu {NUM} nntile {NUM} \(nntile/cpu {NUM};",
    "ratio": rf"^ratio nntile/cpu: {NUM}$",
}


def _eager_macs(step) -> int:
    with FlopCounterMode(display=False) as fc:
        step()
    return fc.get_total_flops() // 2


def test_mlp_macs_match_flop_counter():
    # torch.nn.Linear layers of DeepReLU's shapes: the counter sees their products (ours run as one custom op)
    dims = [784, 64, 48, 10]
    model = torch.nn.Sequential(*[torch.nn.Linear(i, o, bias=False) for i, o in zip(dims, dims[1:])])
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    got = _eager_macs(lambda: F.cross_entropy(model(x), y).backward())
    assert mlp_step.step_macs(model, 32) == got
    assert got < 3 * 32 * (784 * 64 + 64 * 48 + 48 * 10)  # the first layer's grad input is not computed


@pytest.mark.parametrize("size", ["small", "medium"])
def test_gpt2_macs_match_flop_counter(size):
    p = gpt2_step.PRESETS[size]
    if size == "medium":  # the formula at the medium shape, on a cheap model: fewer layers, smaller batch
        p = gpt2_step.Preset(n_layer=1, n_embd=p.n_embd, n_head=p.n_head, vocab=p.vocab, seq=p.seq, batch=1, steps=10)
    model = gpt2_step.gpt2(p)
    ids = torch.randint(0, p.vocab, (p.batch, p.seq))
    assert gpt2_step.step_macs(p) == _eager_macs(lambda: model(input_ids=ids, labels=ids).loss.backward())


@pytest.mark.parametrize("width, image", [(16, 64), (4, 16)])
def test_cnn_macs_match_flop_counter(width, image):
    model = cnn_step.resnet(width, 10)
    x, y = torch.randn(2, 3, image, image), torch.randint(0, 10, (2,))
    got = _eager_macs(lambda: F.cross_entropy(model(x), y).backward())
    assert cnn_step.step_macs(model, 2, image) == got
    fwd, stem = _eager_macs(lambda: model(x)), 2 * image * image * width * 3 * 9
    assert got == 3 * fwd - stem  # the stem's grad input is not computed


def _run(script: str, *args: str) -> str:
    r = subprocess.run([sys.executable, str(BENCH / script), "--mm-size", "256", "--rss-steps", "1", *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _printed(out: str, pattern: str) -> float:
    return float(re.search(pattern, out, re.M).group(1))


def _check_json(out: str, path: Path, argv: list[str]) -> dict:
    """The result file ``--json`` wrote holds the run's argv and the figures printed (to
    their printed precision), with the keys report_pages.py reads."""
    rec = json.loads(path.read_text())
    assert rec["schema"] == 1 and rec["argv"] == argv
    assert datetime.datetime.fromisoformat(rec["date"]).tzinfo is not None
    assert set(rec["machine"]) >= {"cpu", "cores", "torch", "torch_nntile", "starpu", "python", "torch_threads",
                                   "starpu_workers"}
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", rec["machine"]["starpu"]), rec["machine"]["starpu"]
    assert "json" not in rec["options"] and "rss_side" not in rec["options"]
    for side, label in (("cpu", "cpu eager step"), ("nntile", "nntile step")):
        got = rec[side]
        assert len(got["block_ms"]) == rec["steps"] // rec["block"] and all(t > 0 for t in got["block_ms"])
        assert round(got["median_ms"], 2) == _printed(out, rf"^{label}: +median +{NUM} ms")
    assert rec["ratio"] == pytest.approx(rec["nntile"]["median_ms"] / rec["cpu"]["median_ms"])
    assert f"{rec['ratio']:.2f}" == out.strip().splitlines()[-1].split()[-1]
    floor = rec["floor"]
    assert f"{floor['ms']:.2f}" == re.search(FIGURES["floor"], out, re.M).group(1)
    assert floor["nntile_over_floor"] == pytest.approx(rec["nntile"]["median_ms"] / floor["ms"])
    assert len(floor["rates_gmac_s"]) == len(rec["cpu"]["block_ms"])
    assert f"{rec['best_floor']['ms']:.2f}" == re.search(FIGURES["best floor"], out, re.M).group(1)
    if rec["options"]["rss_steps"] > 0:
        cpu_mib, dev_mib, _ = re.search(FIGURES["rss"], out, re.M).groups()
        assert (rec["cpu"]["peak_rss_mib"], rec["nntile"]["peak_rss_mib"]) == (float(cpu_mib), float(dev_mib))
        assert rec["rss"]["nntile_over_cpu"] == pytest.approx(float(dev_mib) / float(cpu_mib))
    else:
        assert rec["rss"] is None and rec["cpu"]["peak_rss_mib"] is None
    return rec


def test_mlp_step_writes_json(tmp_path):
    """The smallest run there is (no memory processes: one interpreter, a few seconds)."""
    path = tmp_path / "sub" / "mlp.json"
    argv = ["--steps", "2", "--block", "1", "--warmup", "1", "--batch", "64", "--tile", "32", "--mm-size", "256",
            "--rss-steps", "0", "--json", str(path)]
    r = subprocess.run([sys.executable, str(BENCH / "mlp_step.py"), *argv], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = _check_json(r.stdout, path, argv)
    assert rec["benchmark"] == "mlp_step" and rec["steps"] == 2 and rec["block"] == 1
    assert rec["options"]["batch"] == 64 and rec["tiling"] == "batch 32" and rec["captured"] is False
    assert report_pages.command(rec) == "mlp_step.py " + " ".join(argv[:-2])


def test_cnn_step_writes_json(tmp_path):
    """A tiny ResNet step (batch 8 of 3x16x16, width 4, batch tiles of 4; no memory
    processes): the losses after warm-up agree, nothing runs on the host fallback."""
    path = tmp_path / "cnn.json"
    argv = ["--steps", "2", "--block", "1", "--warmup", "1", "--batch", "8", "--image", "16", "--width", "4",
            "--tile", "4", "--mm-size", "256", "--rss-steps", "0", "--json", str(path)]
    r = subprocess.run([sys.executable, str(BENCH / "cnn_step.py"), *argv], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = _check_json(r.stdout, path, argv)
    assert rec["benchmark"] == "cnn_step" and rec["steps"] == 2 and rec["tiling"] == "batch 4"
    assert rec["model"] in r.stdout and "batch 8 of 3x16x16" in rec["model"]
    loss = rec["loss_after_warmup"]
    assert abs(loss["nntile"] - loss["cpu"]) <= 1e-5 * loss["cpu"], loss
    assert f"loss after warm-up: cpu {loss['cpu']:.6f}, nntile {loss['nntile']:.6f}" in r.stdout
    assert rec["fallback_ops_per_step"] == {} and "fallback" not in r.stdout
    assert rec["floor"]["gmac"] * 1e9 == pytest.approx(cnn_step.step_macs(cnn_step.resnet(4, 10), 8, 16))
    assert report_pages.command(rec) == "cnn_step.py " + " ".join(argv[:-2])


def _check_figures(out: str) -> None:
    lines = out.strip().splitlines()
    for name, pattern in FIGURES.items():
        m = re.search(pattern, out, re.M)
        assert m is not None, f"no {name} line in:\n{out}"
        assert all(float(g) > 0 for g in m.groups()), m.group(0)
    assert re.fullmatch(FIGURES["ratio"], lines[-1]), "the ratio line must stay last"
    floor = re.search(FIGURES["floor"], out, re.M).group(1)
    dev = re.search(rf"^nntile step: +median +{NUM} ms", out, re.M).group(1)
    _assert_quotient(re.search(FIGURES["nntile/floor"], out, re.M).group(1), dev, floor)
    best, _rate, dev_best, _cpu_best = re.search(FIGURES["best floor"], out, re.M).groups()
    _assert_quotient(dev_best, dev, best)
    cpu_mib, dev_mib, ratio = re.search(FIGURES["rss"], out, re.M).groups()
    _assert_quotient(ratio, dev_mib, cpu_mib)


def _assert_quotient(q: str, a: str, b: str) -> None:
    """Printed ``q`` is ``a / b`` of the values behind printed ``a`` and ``b``: each of
    the three is off by up to half its last digit (a floor of 3.18 ms is 3.175-3.185,
    so a quotient near 8 may be 0.013 off what the printed figures give)."""
    def half(x: str) -> float:
        return 0.5 * 10.0 ** -len(x.partition(".")[2])

    qv, av, bv = float(q), float(a), float(b)
    lo = (av - half(a)) / (bv + half(b)) - half(q)
    hi = (av + half(a)) / (bv - half(b)) + half(q)
    assert lo <= qv <= hi, f"{q} is not {a} / {b} (between {lo:.4f} and {hi:.4f})"


@pytest.mark.slow
def test_mlp_step_prints_figures(tmp_path):
    args = ["--steps", "2", "--block", "1", "--warmup", "1", "--batch", "64", "--tile", "32", "--json", str(tmp_path / "r.json")]
    out = _run("mlp_step.py", *args)
    _check_figures(out)
    _check_json(out, tmp_path / "r.json", ["--mm-size", "256", "--rss-steps", "1", *args])


@pytest.mark.slow
def test_gpt2_step_prints_figures(tmp_path):
    args = ["--steps", "10", "--block", "5", "--warmup", "1", "--tile-seq", "32", "--json", str(tmp_path / "r.json")]
    out = _run("gpt2_step.py", *args)
    _check_figures(out)
    assert "untiled" not in out and "seq 32" in out
    rec = _check_json(out, tmp_path / "r.json", ["--mm-size", "256", "--rss-steps", "1", *args])
    assert rec["benchmark"] == "gpt2_step" and rec["tiling"] == "seq 32" and rec["model"] in out
    assert f"{rec['loss_after_warmup']['cpu']:.6f}" in out and rec["fallback_ops_per_step"] == {}


@pytest.mark.slow
def test_gpt2_step_fused_adamw_prints_figures():
    out = _run("gpt2_step.py", "--steps", "10", "--block", "5", "--warmup", "1", "--fused")
    _check_figures(out)
    assert "AdamW (fused)" in out and "fallback" not in out


@pytest.mark.slow
def test_gpt2_step_sdpa_attention_prints_figures():
    out = _run("gpt2_step.py", "--steps", "10", "--block", "5", "--warmup", "1", "--attn", "sdpa", "--seq", "48")
    _check_figures(out)
    assert "seq 48" in out and "sdpa attention" in out and "fallback" not in out


@pytest.mark.slow
def test_cnn_step_prints_figures(tmp_path):
    args = ["--steps", "2", "--block", "1", "--warmup", "1", "--batch", "8", "--image", "32", "--width", "4",
            "--tile", "4", "--json", str(tmp_path / "r.json")]
    out = _run("cnn_step.py", *args)
    _check_figures(out)
    rec = _check_json(out, tmp_path / "r.json", ["--mm-size", "256", "--rss-steps", "1", *args])
    assert rec["benchmark"] == "cnn_step" and rec["fallback_ops_per_step"] == {}


def test_gpt2_help_names_presets_and_tilings():
    r = subprocess.run([sys.executable, str(BENCH / "gpt2_step.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--size {medium,small}" in r.stdout and "vocab tiled by 2048" in r.stdout


# -- report_pages.py ----------------------------------------------------------------

PAGE = "# Benchmarks\n\nProse by hand.\n\n<!-- begin generated -->\nold\n<!-- end generated -->\n\nMore prose.\n"


def _result(benchmark: str, argv: list[str], cpu: list[float], dev: list[float], floor_ms: float,
            rss: tuple[float, float] | None) -> dict:
    """A synthetic result as the benchmarks write it (the keys report_pages.py reads)."""
    med_c, med_d = sorted(cpu)[len(cpu) // 2], sorted(dev)[len(dev) // 2]
    return {
        "schema": 1, "benchmark": benchmark, "argv": argv, "options": {}, "date": "2026-12-06T01:02:03Z",
        "wall_s": 42.0, "load_avg": [1.5, 1.0, 0.5], "commit": "abc1234",
        "machine": {"cpu": "Test CPU", "cores": 2, "torch": "2.13.0", "torch_nntile": "0.1.0", "starpu": "1.3.10",
                    "python": "3.11.7", "torch_threads": 2, "starpu_workers": 2},
        "steps": 5 * len(cpu), "block": 5,
        "cpu": {"median_ms": med_c, "block_ms": cpu, "peak_rss_mib": rss and rss[0]},
        "nntile": {"median_ms": med_d, "block_ms": dev, "peak_rss_mib": rss and rss[1]},
        "ratio": med_d / med_c,
        "floor": {"ms": floor_ms, "gmac": 11.0, "rate_gmac_s": 11.0 / floor_ms * 1e3, "rates_gmac_s": [100.0],
                  "mm_size": 2048, "nntile_over_floor": med_d / floor_ms, "cpu_over_floor": med_c / floor_ms},
        "best_floor": {"ms": floor_ms, "products": 10, "rate_gmac_s": 1.0, "nntile_over_floor": 1.0,
                       "cpu_over_floor": 1.0},
        "rss": rss and {"cpu_mib": rss[0], "nntile_mib": rss[1], "nntile_over_cpu": rss[1] / rss[0], "steps": 3,
                        "covers": "after warm-up"},
        "model": "a model", "tiling": "batch 256", "captured": "--capture" in argv,
    }


def _write_results(tmp_path: Path) -> list[Path]:
    results = {
        "gpt2_step": _result("gpt2_step", ["--json", "x.json"], [30.0, 34.0, 32.0], [40.0, 41.0, 39.6], 6.4, None),
        "mlp_step-capture": _result("mlp_step", ["--capture", "--json=y.json"], [130.0, 128.0, 129.0],
                                    [100.0, 101.0, 96.0], 80.0, (480.0, 456.0)),
        "mlp_step": _result("mlp_step", [], [120.0, 140.0, 100.0], [90.0, 93.0, 87.0], 75.0, (500.0, 470.0)),
    }
    paths = []
    for stem, rec in results.items():
        paths.append(tmp_path / f"{stem}.json")
        paths[-1].write_text(json.dumps(rec))
    return paths


def test_report_pages_table_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    paths = _write_results(tmp_path)
    page, img = tmp_path / "docs" / "benchmarks.md", tmp_path / "docs" / "img"
    page.parent.mkdir()
    page.write_text(PAGE)
    img.mkdir()
    (img / "bench-stale.png").write_bytes(b"old")
    (img / "other.png").write_bytes(b"kept")
    argv = [*map(str, paths), "--page", str(page), "--img-dir", str(img)]
    assert report_pages.main(argv) == 0
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nProse by hand.\n\n<!-- begin generated -->\n")
    assert text.endswith("<!-- end generated -->\n\nMore prose.\n") and "\nold\n" not in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    # page order: the MLP first, its plain run before --capture; --json and its value left out
    assert rows[0] == ("| `mlp_step.py` | Test CPU, 2 cores | 2026-12-06 | 120 | 90.0 | 0.75 | 75.0 | 1.20 "
                       "| 500 / 470 (0.94) |")
    assert rows[1] == ("| `mlp_step.py --capture` | Test CPU, 2 cores | 2026-12-06 | 129 | 100 | 0.78 | 80.0 "
                       "| 1.25 | 480 / 456 (0.95) |")
    assert rows[2] == ("| `gpt2_step.py` | Test CPU, 2 cores | 2026-12-06 | 32.0 | 40.0 | 1.25 | 6.40 | 6.25 "
                       "| not measured |")
    assert rows[3].startswith("| `mlp_step.py` | a model | batch 256 | 15 (5) | 146.7 | 2.13.0 | 1.3.10 | 3.11.7 "
                              "| abc1234 | 1.5 | 42 | `mlp_step.json` |")
    assert "| batch 256, captured |" in rows[4]
    pngs = ["bench-gpt2_step.png", "bench-mlp_step-capture.png", "bench-mlp_step.png", "bench-overview.png"]
    assert sorted(p.name for p in img.glob("bench-*.png")) == pngs and (img / "other.png").exists()
    for name in pngs:
        assert f"](img/{name})" in text
    first = {name: (img / name).read_bytes() for name in pngs}
    assert all(b.startswith(b"\x89PNG") and b"matplotlib" not in b for b in first.values())
    assert report_pages.main([*argv, "--check"]) == 0
    assert report_pages.main(argv) == 0  # the same inputs: the same page and the same bytes
    assert page.read_text() == text and {name: (img / name).read_bytes() for name in pngs} == first


RUN_KEYS = {"ranks", "workers_per_rank", "step_ms", "block_ms", "sent_mib_max", "sent_mib_mean", "ring_allreduce_mib",
            "sent_over_ring", "owned_mib_max", "held_mib_max", "peak_rss_mib_max", "param_mib"}
PROCESSES = "\n<!-- begin generated: processes -->\nold\n<!-- end generated: processes -->\n\nEnd.\n"


def _run_of(ranks: int, step_ms: float, sent: float, owned: float | None) -> dict:
    """A synthetic run of ``ranks`` processes as mpi_step.py writes it (params of 15 MiB)."""
    ring = 2 * (ranks - 1) / ranks * 15.0
    return {"ranks": ranks, "workers_per_rank": max(1, 2 // ranks), "step_ms": step_ms,
            "block_ms": [step_ms * 0.9, step_ms * 1.1], "sent_mib_max": sent, "sent_mib_mean": sent * 0.9,
            "ring_allreduce_mib": ring, "sent_over_ring": sent / ring if ring else None, "owned_mib_max": owned,
            "held_mib_max": owned and owned * 1.25, "peak_rss_mib_max": 400.0 + 10 * ranks, "param_mib": 15.0}


def _mpi_result(tmp_path: Path) -> Path:
    rec = _result("mpi_step", ["--json", "z.json", "--ranks", "1,2,4"], [1.0], [1.0], 1.0, None)
    for key in ("steps", "block", "cpu", "nntile", "ratio", "floor", "best_floor", "rss", "captured"):
        del rec[key]
    rec |= {"options": {"steps": 10, "block": 5, "workers": 2, "ranks": "1,2,4"}, "model": "an MLP",
            "runs": [_run_of(1, 87.2, 0.0, 188.0), _run_of(2, 213.4, 19.56, 33.5), _run_of(4, 9.5, 21.2, None)]}
    path = tmp_path / "mpi_step.json"
    path.write_text(json.dumps(rec))
    return path


def test_report_pages_processes_part(tmp_path, capsys):
    """A result with ``runs`` goes to the second part, a row per process count; its plot is
    kept, made twice to the same bytes, and checked; a page without the second markers is refused."""
    pytest.importorskip("matplotlib")
    paths = [*_write_results(tmp_path), _mpi_result(tmp_path)]
    page, img = tmp_path / "benchmarks.md", tmp_path / "img"
    page.write_text(PAGE + PROCESSES)
    argv = [*map(str, paths), "--page", str(page), "--img-dir", str(img)]
    assert report_pages.main(argv) == 0
    text = page.read_text()
    first, second = text.split("<!-- begin generated: processes -->\n")
    assert "mpi_step" not in first and len([ln for ln in first.splitlines() if ln.startswith("| `")]) == 6
    assert second.startswith("<!-- Made by benchmarks/report_pages.py") and second.endswith(
        "\n<!-- end generated: processes -->\n\nEnd.\n")
    rows = [ln for ln in second.splitlines() if ln.startswith("| `")]
    assert rows == [
        "| `mpi_step.py --ranks 1,2,4` | Test CPU, 2 cores | 2026-12-06 | 1 | 2 | 87.2 | 0.00 | 0.00 | 0.00 | - "
        "| 188.0 | 235.0 | 410 |",
        "| `mpi_step.py --ranks 1,2,4` | Test CPU, 2 cores | 2026-12-06 | 2 | 1 | 213 | 19.56 | 17.60 | 15.00 | 1.30 "
        "| 33.5 | 41.9 | 420 |",
        "| `mpi_step.py --ranks 1,2,4` | Test CPU, 2 cores | 2026-12-06 | 4 | 1 | 9.50 | 21.20 | 19.08 | 22.50 | 0.94 "
        "| - | - | 440 |",
        "| `mpi_step.py --ranks 1,2,4` | an MLP | batch 256 | 10 (5) | 2 | 2.13.0 | 1.3.10 | 3.11.7 | abc1234 | 1.5 "
        "| 42 | `mpi_step.json` |",
    ]
    assert "](img/bench-mpi_step.png)" in second and "bench-mpi_step" not in first
    plot = img / "bench-mpi_step.png"
    once = plot.read_bytes()
    assert once.startswith(b"\x89PNG") and b"matplotlib" not in once
    assert report_pages.main([*argv, "--check"]) == 0
    assert report_pages.main(argv) == 0  # the stale-plot sweep keeps it, and the bytes are the same
    assert plot.read_bytes() == once and page.read_text() == text
    plot.unlink()
    assert report_pages.main([*argv, "--check"]) == 1 and "bench-mpi_step.png" in capsys.readouterr().err
    page.write_text(PAGE)
    with pytest.raises(SystemExit, match="generated: processes"):
        report_pages.main(argv)


def test_report_pages_processes_part_alone(tmp_path):
    """With results of several processes only, the first part says it has none, and no overview is drawn."""
    pytest.importorskip("matplotlib")
    page, img = tmp_path / "benchmarks.md", tmp_path / "img"
    page.write_text(PAGE + PROCESSES)
    argv = [str(_mpi_result(tmp_path)), "--page", str(page), "--img-dir", str(img)]
    assert report_pages.main(argv) == 0
    first = page.read_text().split("<!-- begin generated: processes -->")[0]
    assert "\nNo result files of this kind.\n\n<!-- end generated -->\n" in first
    assert sorted(p.name for p in img.iterdir()) == ["bench-mpi_step.png"]
    assert report_pages.main([*argv, "--check"]) == 0


@pytest.mark.skipif(shutil.which("mpirun") is None or not torch_nntile.built_with_mpi(),
                    reason="needs OpenMPI's mpirun and StarPU-MPI (the project's own StarPU build)")
def test_mpi_step_writes_json(tmp_path):
    path = tmp_path / "mpi.json"
    argv = ["--ranks", "1,2", "--steps", "2", "--block", "1", "--warmup", "1", "--batch", "64", "--tile", "32",
            "--json", str(path)]
    r = subprocess.run([sys.executable, str(BENCH / "mpi_step.py"), *argv], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads(path.read_text())
    assert rec["benchmark"] == "mpi_step" and rec["argv"] == argv and "runs" in rec and "cpu" not in rec
    assert report_pages.command(rec) == "mpi_step.py " + " ".join(argv[:-2])
    one, two = rec["runs"]
    assert set(one) == RUN_KEYS and set(two) == RUN_KEYS
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert one["sent_mib_max"] == 0 and one["sent_over_ring"] is None
    assert two["sent_mib_max"] > 0 and two["sent_over_ring"] == pytest.approx(two["sent_mib_max"] / two["ring_allreduce_mib"])
    assert len(one["block_ms"]) == len(two["block_ms"]) == 2
    assert two["owned_mib_max"] < one["owned_mib_max"] <= one["held_mib_max"]


def test_report_pages_check_passes_on_the_committed_page():
    r = subprocess.run([sys.executable, str(BENCH / "report_pages.py"), "--check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_report_pages_check_fails_on_an_edited_copy(tmp_path, capsys):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs" / "img", docs / "img")
    shutil.copy(ROOT / "docs" / "benchmarks.md", docs / "benchmarks.md")
    argv = ["--page", str(docs / "benchmarks.md"), "--img-dir", str(docs / "img")]
    assert report_pages.main([*argv, "--check"]) == 0  # the copy as it is
    text = (docs / "benchmarks.md").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| `mlp_step.py` |"))
    (docs / "benchmarks.md").write_text(text.replace(row, row.replace(" |", " 0 |", 4)))
    assert report_pages.main([*argv, "--check"]) == 1
    assert "not what the results give" in capsys.readouterr().err
    (docs / "benchmarks.md").write_text(text)
    (docs / "img" / "bench-overview.png").unlink()
    assert report_pages.main([*argv, "--check"]) == 1
    assert "bench-overview.png" in capsys.readouterr().err
