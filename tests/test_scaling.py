"""benchmarks/scaling.py: the worker counts it runs, and a ``--quick`` run to 2 workers in
fresh interpreters (one per model and count) printing a table per model whose rows are
those of its ``--json`` file (no timing asserted beyond being positive)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import scaling  # noqa: E402

NUM = r"([0-9]+\.[0-9]+)"
ROW = re.compile(rf"^ +([0-9]+)(\*\([0-9]+/[0-9]+\))? +{NUM} +{NUM} +{NUM} +{NUM} +{NUM}$")


@pytest.mark.parametrize(("most", "counts"), [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_worker_counts_double_up_to_the_max(most, counts):
    assert scaling.worker_counts(most) == counts


def _tables(out: str) -> dict[str, list[tuple[str, ...]]]:
    """Each model's table rows as printed, by the model's name."""
    tables: dict[str, list[tuple[str, ...]]] = {}
    model = None
    for line in out.splitlines():
        if m := re.match(r"^([a-z0-9-]+): ", line):
            model = m.group(1)
            tables[model] = []
        elif m := ROW.match(line):
            tables[model].append(m.groups())
    return tables


def test_quick_run_prints_tables_and_writes_json(tmp_path):
    path = tmp_path / "scaling.json"
    argv = ["--quick", "--max-workers", "2", "--json", str(path)]
    r = subprocess.run([sys.executable, str(BENCH / "scaling.py"), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    tables = _tables(r.stdout)
    assert list(tables) == ["mlp", "gpt2-medium"], r.stdout
    rec = json.loads(path.read_text())
    assert rec["schema"] == 1 and rec["benchmark"] == "scaling" and rec["argv"] == argv
    assert "json" not in rec["options"] and "one" not in rec["options"] and rec["counts"] == [1, 2]
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", rec["machine"]["starpu"]), rec["machine"]
    assert list(rec["models"]) == list(tables)
    for model, printed in tables.items():
        got = rec["models"][model]
        assert got["model"] in r.stdout and got["steps"] == 2 and got["block"] == 1
        rows = got["rows"]
        assert [p[0] for p in printed] == ["1", "2"] and [row["workers"] for row in rows] == [1, 2]
        for p, row in zip(printed, rows):
            for side in ("cpu", "nntile"):
                assert len(row[side]["block_ms"]) == 2 and all(t > 0 for t in row[side]["block_ms"])
            assert row["starpu_workers"] >= 1 and row["torch_threads"] >= 1
            assert (p[1] is None) == (row["starpu_workers"] == row["torch_threads"] == row["workers"])
            figures = (row["cpu"]["median_ms"], row["nntile"]["median_ms"], row["ratio"], row["cpu_speedup"],
                       row["nntile_speedup"])
            assert tuple(float(x) for x in p[2:]) == tuple(round(x, 2) for x in figures)
            assert row["ratio"] == pytest.approx(row["nntile"]["median_ms"] / row["cpu"]["median_ms"])
        assert rows[0]["cpu_speedup"] == rows[0]["nntile_speedup"] == 1.0
        assert rows[1]["nntile_speedup"] == pytest.approx(rows[0]["nntile"]["median_ms"] / rows[1]["nntile"]["median_ms"])
