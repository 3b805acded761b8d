"""benchmarks/mlp_step.py and gpt2_step.py: their multiply-add counts match what PyTorch's
flop counter sees in an eager step, and each runs with tiny settings in a fresh
interpreter and prints every figure line in a form that parses, its quotients those of
the figures printed (no timing asserted).
The runs start three interpreters each (the timed one and one per side for the peak
memory), so they are marked slow."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpt2_step  # noqa: E402
import mlp_step  # noqa: E402

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


def _run(script: str, *args: str) -> str:
    r = subprocess.run([sys.executable, str(BENCH / script), "--mm-size", "256", "--rss-steps", "1", *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


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
def test_mlp_step_prints_figures():
    _check_figures(_run("mlp_step.py", "--steps", "2", "--block", "1", "--warmup", "1", "--batch", "64", "--tile", "32"))


@pytest.mark.slow
def test_gpt2_step_prints_figures():
    out = _run("gpt2_step.py", "--steps", "10", "--block", "5", "--warmup", "1", "--tile-seq", "32")
    _check_figures(out)
    assert "untiled" not in out and "seq 32" in out


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


def test_gpt2_help_names_presets_and_tilings():
    r = subprocess.run([sys.executable, str(BENCH / "gpt2_step.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--size {medium,small}" in r.stdout and "vocab tiled by 2048" in r.stdout
