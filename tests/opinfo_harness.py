"""Conformance against PyTorch's own OpInfo database (``op_db``).

For an op_db entry, every float32 CPU sample runs on CPU and on nntile; outputs and
the gradients of the differentiable inputs must agree (values within a tolerance
scaled to the result's magnitude, integer and bool values exactly, shapes and
dtypes exactly). A sample first runs with ``cpu_fallback=False``, untiled and with
dim 0 of every input split into two tiles: in the graph, each ATen op by a tiled
kernel or as an untiled task (counted apart). Only where an op it needs cannot be in
the graph does it run again through the host fallback, and the reason is recorded.

Run as a script to write ``docs/ops.md`` from the whole database:
``python tests/opinfo_harness.py --doc docs/ops.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from conftest import TOL_SCALE
from torch.utils._pytree import tree_flatten, tree_map

import torch_nntile
from torch_nntile import stats
from torch_nntile.backend.aten import REGISTERED
from torch_nntile.backend.table_batched import SPLITS
from torch_nntile.graph import axes

RTOL = 1e-5 * TOL_SCALE  # relative, per element
ATOL = 1e-5 * TOL_SCALE  # absolute, times max(1, largest magnitude of the CPU result)
GRAD_TOL = 1e-4 * TOL_SCALE  # gradients: a chain of ops, accumulated in another order when tiled

# Entries whose CPU output is not a function of the sample: it draws random numbers
# with a seed-dependent pattern, or it is uninitialized memory.
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}

# Entries whose extra tensor arguments PyTorch requires on the CPU whatever the device.
CPU_ARGS = {"tensor_split"}

# Entries known to fail, each with the PyTorch limitation behind it.
XFAIL: dict[str, str] = {}


class Unsupported(Exception):
    """The sample needs an ATen op nntile does not implement."""


@dataclasses.dataclass
class Outcome:
    """What one entry did: samples run natively (tiled kernels only) / in the graph
    with untiled tasks / through the host fallback / skipped, the first failure, and
    the ATen ops that ran natively, as untiled tasks or on the host (with the reason)."""

    name: str
    native: int = 0
    untiled: int = 0
    fallback: int = 0
    skipped: int = 0
    errors: int = 0  # error inputs checked: nntile raises PyTorch's exception type
    failure: str | None = None
    native_ops: set[str] = dataclasses.field(default_factory=set)
    untiled_ops: set[str] = dataclasses.field(default_factory=set)
    fallback_ops: dict[str, str] = dataclasses.field(default_factory=dict)  # op -> why not in the graph

    @property
    def status(self) -> str:
        if self.failure:
            return "failing"
        if self.fallback:
            return "host fallback" if not (self.native or self.untiled) else "partly host"
        if self.untiled:
            return "untiled" if not self.native else "partly untiled"
        return "native" if self.native else "skipped"


def float32_entries() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def entry_id(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


# -- moving samples ----------------------------------------------------------------


def _to_device(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.device.type == "cpu":
        return x.detach().to("nntile").requires_grad_(x.requires_grad)
    return x


def _fresh_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def _leaves(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor) and x.requires_grad]


def _tile_dim0(tree: Any) -> None:
    """Split dim 0 of every nntile input into (at least) two tiles where it has two rows."""
    for x in tree_flatten(tree)[0]:
        if isinstance(x, torch.Tensor) and x.device.type == "nntile" and x.dim() and x.shape[0] >= 2:
            name = f"opinfo{next(_NAMES)}"
            torch_nntile.set_axis_group_name(x, {0: name})
            torch_nntile.set_axis_group_tiling(name, math.ceil(x.shape[0] / 2))


_NAMES = itertools.count()


# -- comparing ------------------------------------------------------------------


def compare(got: Any, want: Any, tol: float, where: str) -> None:
    """Raise AssertionError unless ``got`` (from nntile) matches ``want`` (from CPU)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{where}: got {type(got).__name__}, want a tensor")
        if got.layout != want.layout:
            raise AssertionError(f"{where}: layout {got.layout}, want {want.layout}")
        if want.layout != torch.strided:
            got, want = got.to_dense(), want.to_dense()
        if got.device.type == "nntile":
            got = got.detach().cpu()
        if got.shape != want.shape:
            raise AssertionError(f"{where}: shape {list(got.shape)}, want {list(want.shape)}")
        if got.dtype != want.dtype:
            raise AssertionError(f"{where}: dtype {got.dtype}, want {want.dtype}")
        want = want.detach()
        if want.dtype.is_floating_point or want.dtype.is_complex:
            finite = want[torch.isfinite(want)] if want.numel() else want
            scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
            ok = torch.isclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True)
            if not bool(ok.all()):
                bad = (~ok).nonzero()[0].tolist()
                raise AssertionError(f"{where}: at {bad} got {got[tuple(bad)].item()}, want {want[tuple(bad)].item()} "
                                     f"({int((~ok).sum())} of {ok.numel()} elements differ; tolerance {tol:g} scaled)")
        elif not torch.equal(got, want):
            raise AssertionError(f"{where}: values differ")
    elif isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            raise AssertionError(f"{where}: got {type(got).__name__} of {len(got) if hasattr(got, '__len__') else '?'}")
        for i, (g, w) in enumerate(zip(got, want)):
            compare(g, w, tol, f"{where}[{i}]")
    elif isinstance(want, float) and math.isnan(want):
        if not (isinstance(got, float) and math.isnan(got)):
            raise AssertionError(f"{where}: got {got!r}, want nan")
    elif got != want and not (isinstance(want, float) and math.isclose(got, want, rel_tol=tol, abs_tol=tol)):
        raise AssertionError(f"{where}: got {got!r}, want {want!r}")


def _cotangents(outs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]


def _diff_outputs(out: Any) -> list[torch.Tensor]:
    return [o for o in tree_flatten(out)[0]
            if isinstance(o, torch.Tensor) and o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)]


# -- one sample -------------------------------------------------------------------


def _call(op: Any, sample: Any) -> Any:
    return op(sample.input, *sample.args, **sample.kwargs)


def _seeded(op: Any, sample: Any, seed: int) -> Any:
    torch.manual_seed(seed)
    return _call(op, sample)


def is_seed_dependent(op: Any, sample: Any) -> bool:
    """Whether two CPU runs with different seeds differ (random ops, dropout)."""
    if op.name in UNINITIALIZED:
        return True
    try:
        with torch.no_grad():
            a, b = _seeded(op, sample, 1), _seeded(op, sample, 2)
        compare(a, b, 0.0, "rerun")
    except AssertionError:
        return True
    except Exception:  # noqa: BLE001 - CPU raises for this sample: run_sample checks nntile raises alike
        return False
    return False


def run_sample(op: Any, sample: Any, fallback: bool, tiled: bool, grad: bool) -> None:
    """Run one sample on CPU and nntile and compare; raise Unsupported for a missing op."""
    torch_nntile.init_context(ncpu=2, cpu_fallback=fallback)
    cpu_sample = sample.transform(_fresh_cpu)
    dev_sample = sample.transform(_to_device)
    if op.name in CPU_ARGS:
        dev_sample.args = sample.transform(_fresh_cpu).args
    if tiled:
        _tile_dim0((dev_sample.input, dev_sample.args, dev_sample.kwargs))
    try:
        want = _seeded(op, cpu_sample, 0)
    except Exception as e:  # noqa: BLE001 - PyTorch rejects the sample: nntile must too, alike
        _expect_raise(op, dev_sample, type(e))
        return
    try:
        got = _seeded(op, dev_sample, 0)
        compare(got, want, RTOL, "output")
        if not grad:
            return
        want_p = cpu_sample.output_process_fn_grad(want)
        got_p = dev_sample.output_process_fn_grad(got)
        wouts, gouts = _diff_outputs(want_p), _diff_outputs(got_p)
        wins = _leaves((cpu_sample.input, cpu_sample.args, cpu_sample.kwargs))
        gins = _leaves((dev_sample.input, dev_sample.args, dev_sample.kwargs))
        if not wouts or not wins:
            return
        if len(gouts) != len(wouts):
            raise AssertionError(f"{len(gouts)} differentiable outputs, want {len(wouts)}")
        cots = _cotangents(wouts, 7)
        wg = torch.autograd.grad(wouts, wins, cots, allow_unused=True)
        gg = torch.autograd.grad(gouts, gins, [c.to(o.device) for c, o in zip(cots, gouts)], allow_unused=True)
        for i, (g, w) in enumerate(zip(gg, wg)):
            if w is None:
                continue
            if g is None:
                raise AssertionError(f"gradient of input {i}: None, want a tensor")
            compare(g, w, GRAD_TOL, f"gradient of input {i}")
    except NotImplementedError as e:
        if "not supported on the nntile device" in str(e) and not fallback:
            raise Unsupported(str(e)) from None
        raise
    finally:
        torch_nntile.execute()
        torch_nntile.wait()


def run_error_input(op: Any, err: Any) -> None:
    """PyTorch's error input: nntile raises the same exception type, natively if it can."""
    for fallback in (False, True):
        torch_nntile.init_context(ncpu=2, cpu_fallback=fallback)
        try:
            _expect_raise(op, err.sample_input.transform(_to_device), err.error_type)
            return
        except Unsupported:
            continue


def _read_back(out: Any) -> None:
    for x in tree_flatten(out)[0]:
        if isinstance(x, torch.Tensor) and x.device.type == "nntile":
            x.cpu()


def _expect_raise(op: Any, sample: Any, kind: type[BaseException]) -> None:
    try:
        # An error that depends on values (an index out of range) is raised by the kernel
        # and surfaces at the read-back, as a KernelError of the kernel's exception type.
        _read_back(_seeded(op, sample, 0))
    except NotImplementedError as e:
        if "not supported on the nntile device" in str(e) and not torch_nntile.session.SESSION_STATE.cpu_fallback:
            raise Unsupported(str(e)) from None
        if not isinstance(e, kind):
            raise
    except Exception as e:
        if not isinstance(e, kind):
            raise AssertionError(f"CPU raises {kind.__name__}, nntile {type(e).__name__}: {_first_line(e)}") from e
    else:
        raise AssertionError(f"CPU raises {kind.__name__}, nntile raises nothing")
    finally:
        torch_nntile.execute()
        torch_nntile.wait()


def run_entry(op: Any, tiled_too: bool = True, max_samples: int | None = None) -> Outcome:
    """Every float32 CPU sample of ``op``, natively where nntile can, else on the fallback;
    then its error inputs."""
    out = Outcome(entry_id(op))
    grad = op.supports_autograd
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=grad)
    for n, sample in enumerate(samples):
        if max_samples is not None and n >= max_samples:
            break
        if is_seed_dependent(op, sample):
            out.skipped += 1
            continue
        axes._TILINGS.clear()
        before_calls, before_fb = Counter(stats.OP_CALLS), Counter(stats.FALLBACK_CALLS)
        before_untiled, before_batched = Counter(stats.UNTILED_CALLS), Counter(stats.BATCHED_CALLS)
        try:
            try:
                run_sample(op, sample, fallback=False, tiled=False, grad=grad)
                if tiled_too:
                    run_sample(op, sample, fallback=False, tiled=True, grad=grad)
                if stats.UNTILED_CALLS - before_untiled:
                    out.untiled += 1
                else:
                    out.native += 1
            except Unsupported:
                run_sample(op, sample, fallback=True, tiled=False, grad=grad)
                out.fallback += 1
        except Exception as e:  # noqa: BLE001 - recorded as the entry's failure
            out.failure = f"sample {n} ({_describe(sample)}): {type(e).__name__}: {_first_line(e)}"
            return out
        finally:
            axes._TILINGS.clear()
            torch_nntile.init_context(ncpu=2, cpu_fallback=False)
        out.fallback_ops |= {k: stats.FALLBACK_REASON.get(k, "") for k in stats.FALLBACK_CALLS - before_fb}
        out.untiled_ops |= set(stats.UNTILED_CALLS - before_untiled)
        out.native_ops |= {k for k in stats.OP_CALLS - before_calls if k.removeprefix("aten::") in REGISTERED}
        out.native_ops |= set(stats.BATCHED_CALLS - before_batched)
    for n, err in enumerate(_error_inputs(op)):
        try:
            run_error_input(op, err)
            out.errors += 1
        except Exception as e:  # noqa: BLE001 - recorded as the entry's failure
            out.failure = f"error input {n} ({_describe(err.sample_input)}): {type(e).__name__}: {_first_line(e)}"
            return out
        finally:
            torch_nntile.init_context(ncpu=2, cpu_fallback=False)
    return out


def _error_inputs(op: Any) -> list[Any]:
    if op.error_inputs_func is None:
        return []
    try:
        return [e for e in op.error_inputs("cpu") if _cpu_raises(op, e)]
    except Exception:  # noqa: BLE001 - a generator needing another device or dtype
        return []


def _cpu_raises(op: Any, err: Any) -> bool:
    """Only error inputs PyTorch's CPU build raises for, with the type it states."""
    try:
        _call(op, err.sample_input.transform(_fresh_cpu))
    except err.error_type:
        return True
    except Exception:  # noqa: BLE001
        return False
    return False


def claims_native(op: Any) -> bool:
    """Whether the ATen table registers the entry's own ATen op."""
    return (op.aten_name or op.name) in _REGISTERED_BASES


_REGISTERED_BASES = {r.split(".")[0] for r in REGISTERED}


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


def _describe(sample: Any) -> str:
    def d(x: Any) -> Any:
        return f"T{list(x.shape)}:{str(x.dtype).removeprefix('torch.')}" if isinstance(x, torch.Tensor) else x

    parts = [str(tree_map(d, sample.input))]
    parts += [str(tree_map(d, a)) for a in sample.args]
    parts += [f"{k}={tree_map(d, v)}" for k, v in sample.kwargs.items()]
    s = ", ".join(parts)
    return s if len(s) < 160 else s[:157] + "..."


# -- the table in docs/ops.md ---------------------------------------------------------


_HOW = {"native": "tiled kernel", "untiled": "untiled task", "fallback": "host fallback"}


def write_doc(path: str, outcomes: Iterable[Outcome]) -> None:
    outcomes = list(outcomes)
    ops: dict[str, dict[str, list[str]]] = {}
    reasons: dict[str, str] = {}
    for o in outcomes:
        for kind, names in (("native", o.native_ops), ("untiled", o.untiled_ops), ("fallback", o.fallback_ops)):
            for a in names:
                ops.setdefault(a, {}).setdefault(kind, []).append(o.name)
        reasons |= o.fallback_ops
    counts = Counter(o.status for o in outcomes)
    lines = [
        "# ATen ops on nntile",
        "",
        "Generated by `python tests/opinfo_harness.py --doc docs/ops.md` from PyTorch's OpInfo database",
        f"(torch {torch.__version__}): every op_db entry that supports float32 on CPU, every sample.",
        "An op runs with a *tiled kernel* (registered below), as one *untiled task* in the graph",
        "(PyTorch's CPU kernel on whole values, where PyTorch has a Meta kernel for it), or on the",
        "*host fallback* (`init_context(cpu_fallback=True)`), for the reason given.",
        "",
        f"Entries: {len(outcomes)}; " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ".",
        "",
        "## ATen ops that run only on the host",
        "",
        "| ATen op | why it cannot be in the graph | op_db entries |",
        "|---|---|---|",
    ]
    for a in sorted(reasons):
        ents = sorted(set(ops[a]["fallback"]))
        lines.append(f"| `{a}` | {reasons[a]} | {', '.join(ents[:6])}{' ...' if len(ents) > 6 else ''} |")
    lines += ["", "## ATen ops with tiled kernels", "", "| ATen overload |", "|---|"]
    lines += [f"| `aten::{n}` |" for n in sorted(REGISTERED)]
    lines += ["", "## ATen ops run by PyTorch's CPU kernel per tile", "",
              "Where the call has a batch (dim 0 of its input) to split; otherwise one untiled task.", "",
              "| ATen op |", "|---|"]
    lines += [f"| `{n}` |" for n in sorted(SPLITS)]
    lines += ["", "## ATen ops the samples reached", "",
              "| ATen op | how it ran | op_db entries |", "|---|---|---|"]
    for a in sorted(ops):
        how = " and ".join(_HOW[k] for k in _HOW if k in ops[a])
        ents = sorted({e for v in ops[a].values() for e in v})
        lines.append(f"| `{a}` | {how} | {', '.join(ents[:6])}{' ...' if len(ents) > 6 else ''} |")
    lines += ["", "## op_db entries", "",
              "| entry | status | samples tiled / untiled / host / skipped | error inputs raised alike | note |",
              "|---|---|---|---|---|"]
    for o in sorted(outcomes, key=lambda o: o.name):
        note = o.failure or XFAIL.get(o.name, "")
        lines.append(f"| `{o.name}` | {o.status} | {o.native} / {o.untiled} / {o.fallback} / {o.skipped} | "
                     f"{o.errors} | {note.replace('|', '/')} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    import argparse
    import sys
    import time

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--doc", help="write the table to this markdown file")
    p.add_argument("--only", nargs="*", help="entry names (prefix match)")
    a = p.parse_args()
    torch_nntile.init_context(ncpu=2)
    results = []
    for op in float32_entries():
        if a.only and not any(entry_id(op).startswith(s) for s in a.only):
            continue
        t0 = time.perf_counter()
        try:
            r = run_entry(op)
        except BaseException as e:  # noqa: BLE001 - a harness error is this entry's failure
            r = Outcome(entry_id(op), failure=f"harness: {type(e).__name__}: {_first_line(e)}")
        results.append(r)
        print(f"{r.name:40} {r.status:14} {r.native}/{r.untiled}/{r.fallback}/{r.skipped} {time.perf_counter() - t0:6.1f}s "
              f"{r.failure or ''}", flush=True)
    if a.doc:
        write_doc(a.doc, results)
    sys.exit(1 if any(r.failure and r.name not in XFAIL for r in results) else 0)
