"""Turn benchmark results (the JSON files that ``mlp_step.py``, ``gpt2_step.py``,
``cnn_step.py`` and ``mpi_step.py`` write with ``--json``) into the figures of the docs'
Benchmarks page, so that the page shows measurements, never numbers copied by hand.

The page keeps its prose by hand; two parts of it are this script's. Between the lines
``<!-- begin generated -->`` and ``<!-- end generated -->``, the single-process results: a
table of the current figures, a table of how each run was made and links to the plots.
Between the lines ``<!-- begin generated: processes -->`` and ``<!-- end generated:
processes -->``, the results of several processes (those with ``runs``, one per process
count, as ``mpi_step.py`` writes them): a table with a row per run, a table of how each
result was made and links to their plots. A part with no results says so; a page without
a part's markers is an error only when there are results for it. The plots are PNGs in
the image folder (``bench-<result file's stem>.png`` for each result, ``bench-overview.png``
for the ratios of the single-process ones); other ``bench-*.png`` there are removed as
stale. The same inputs give the same page and the same PNG bytes (no dates of generation,
no matplotlib version in the files).

``--check`` writes nothing: it exits 1 when either generated part differs from what the
results give, or a plot it links to is missing (a test runs it, so the page cannot drift
from the results by a hand edit). It needs no matplotlib.

Usage: ``python benchmarks/report_pages.py [RESULT.json ...] [--page P] [--img-dir D] [--check]``
(default: every ``benchmarks/results/*.json``, ``docs/benchmarks.md``, ``docs/img``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- begin generated -->", "<!-- end generated -->"
P_BEGIN, P_END = "<!-- begin generated: processes -->", "<!-- end generated: processes -->"
ORDER = ("mlp_step", "gpt2_step", "cnn_step", "mpi_step")  # benchmarks in page order; unknown ones after, by name
OVERVIEW = "bench-overview.png"
MADE_BY = [
    "<!-- Made by benchmarks/report_pages.py from the result files named below: rerun the benchmarks with",
    "     --json and then that script; a hand edit here fails its --check. -->",
    "",
]
NONE = "No result files of this kind."

Result = dict[str, Any]


def load(paths: list[Path]) -> list[Result]:
    """The results in page order: by benchmark, then by their options as given (so the
    default run comes before its variants); each carries its file's stem as ``_stem``."""
    results = []
    for path in paths:
        with open(path) as f:
            rec = json.load(f)
        rec["_stem"] = path.stem
        results.append(rec)
    rank = {b: i for i, b in enumerate(ORDER)}
    return sorted(results, key=lambda r: (rank.get(r["benchmark"], len(ORDER)), r["benchmark"], len(options(r)),
                                          options(r), r["_stem"]))


def options(rec: Result) -> list[str]:
    """The run's command-line options less ``--json PATH`` (where the result went is not a setting)."""
    out, skip = [], False
    for a in rec["argv"]:
        if skip:
            skip = False
        elif a == "--json":
            skip = True
        elif not a.startswith("--json="):
            out.append(a)
    return out


def command(rec: Result) -> str:
    return " ".join([f"{rec['benchmark']}.py", *options(rec)])


def image_name(rec: Result) -> str:
    return f"bench-{rec['_stem']}.png"


def ms(x: float) -> str:
    """A step time at the precision the noise allows: whole ms from 100 on, one decimal from 10."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def machine(rec: Result) -> str:
    m = rec["machine"]
    return f"{m['cpu']}, {m['cores']} cores"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def section(results: list[Result], img_rel: str) -> str:
    """The generated part of the single-process results (without the markers)."""
    if not results:
        return "\n".join([*MADE_BY, NONE, ""])
    lines = [
        *MADE_BY,
        "| benchmark | machine | date (UTC) | eager ms a step | nntile ms a step | ratio nntile/cpu | floor ms "
        "| nntile/floor | peak RSS MiB cpu / nntile (nntile/cpu) |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        rss = r.get("rss")
        mem = (f"{rss['cpu_mib']:.0f} / {rss['nntile_mib']:.0f} ({rss['nntile_over_cpu']:.2f})" if rss else "not measured")
        lines.append(f"| `{_cell(command(r))}` | {_cell(machine(r))} | {r['date'][:10]} | {ms(r['cpu']['median_ms'])} "
                     f"| {ms(r['nntile']['median_ms'])} | {r['ratio']:.2f} | {ms(r['floor']['ms'])} "
                     f"| {r['floor']['nntile_over_floor']:.2f} | {mem} |")
    lines += [
        "",
        "How each run was made (steps: timed steps a side, in blocks of the given size; floor rate: the median "
        "`torch.mm` rate between the blocks; load: the machine's 1-minute load average as the run ended, itself "
        "included):",
        "",
        "| benchmark | model | nntile tiling | steps (block) | floor rate GMAC/s | torch | StarPU | Python "
        "| commit | load | run s | result file |",
        "|---|---|---|--:|--:|---|---|---|---|--:|--:|---|",
    ]
    for r in results:
        m = r["machine"]
        tiling = r.get("tiling") or "-"
        if r.get("captured"):
            tiling += ", captured"
        load = r.get("load_avg")
        lines.append(f"| `{_cell(command(r))}` | {_cell(r.get('model') or '-')} | {_cell(tiling)} "
                     f"| {r['steps']} ({r['block']}) | {r['floor']['rate_gmac_s']:.1f} | {m['torch']} | {m['starpu']} "
                     f"| {m['python']} | {r.get('commit') or '-'} | {f'{load[0]:.1f}' if load else '-'} "
                     f"| {r['wall_s']:.0f} | `{r['_stem']}.json` |")
    lines += ["", f"![Ratios of all runs]({img_rel}/{OVERVIEW})", ""]
    for r in results:
        lines += [f"![{_cell(command(r))}: step times]({img_rel}/{image_name(r)})", ""]
    return "\n".join(lines)


def _mib(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def processes_section(results: list[Result], img_rel: str) -> str:
    """The generated part of the results of several processes (without the markers)."""
    if not results:
        return "\n".join([*MADE_BY, NONE, ""])
    lines = [
        *MADE_BY,
        "| benchmark | machine | date (UTC) | ranks | workers per rank | ms a step | sent MiB a step per rank, max "
        "| mean | ring all-reduce MiB (least) | sent/ring | owned MiB (most of a rank) | held MiB (most) "
        "| peak RSS MiB (most) |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        for run in r["runs"]:
            lines.append(f"| `{_cell(command(r))}` | {_cell(machine(r))} | {r['date'][:10]} | {run['ranks']} "
                         f"| {run['workers_per_rank']} | {ms(run['step_ms'])} | {run['sent_mib_max']:.2f} "
                         f"| {run['sent_mib_mean']:.2f} | {run['ring_allreduce_mib']:.2f} | {_mib(run['sent_over_ring'], 2)} "
                         f"| {_mib(run['owned_mib_max'], 1)} | {_mib(run['held_mib_max'], 1)} "
                         f"| {run['peak_rss_mib_max']:.0f} |")
    lines += [
        "",
        "How each was made (steps: timed steps of each process count, in blocks of the given size, timed on rank 0; "
        "workers: StarPU's CPU workers of all ranks together; load: the machine's 1-minute load average as the run "
        "ended, itself included):",
        "",
        "| benchmark | model | nntile tiling | steps (block) | workers | torch | StarPU | Python | commit | load | run s "
        "| result file |",
        "|---|---|---|--:|--:|---|---|---|---|--:|--:|---|",
    ]
    for r in results:
        m, o, load = r["machine"], r["options"], r.get("load_avg")
        lines.append(f"| `{_cell(command(r))}` | {_cell(r.get('model') or '-')} | {_cell(r.get('tiling') or '-')} "
                     f"| {o['steps']} ({o['block']}) | {o.get('workers', '-')} | {m['torch']} | {m['starpu']} "
                     f"| {m['python']} | {r.get('commit') or '-'} | {f'{load[0]:.1f}' if load else '-'} "
                     f"| {r['wall_s']:.0f} | `{r['_stem']}.json` |")
    lines.append("")
    for r in results:
        lines += [f"![{_cell(command(r))}: step time, bytes sent and tiles per rank]({img_rel}/{image_name(r)})", ""]
    return "\n".join(lines)


def render(page: str, generated: str, begin: str = BEGIN, end: str = END, optional: bool = False) -> str:
    """``page`` with its generated part between ``begin`` and ``end`` replaced by ``generated``.
    The markers count only as lines of their own, so the prose may quote them. With
    ``optional``, a page with neither marker is returned as it is."""
    lines = page.splitlines(keepends=True)
    begins = [i for i, ln in enumerate(lines) if ln.rstrip("\n") == begin]
    ends = [i for i, ln in enumerate(lines) if ln.rstrip("\n") == end]
    if optional and not begins and not ends:
        return page
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise SystemExit(f"the page needs one line {begin} and, after it, one line {end}")
    return "".join([*lines[:begins[0] + 1], generated, "\n", *lines[ends[0]:]])


def page_text(old: str, single: list[Result], multi: list[Result], img_rel: str) -> str:
    """The page with both generated parts from the results; a part without results may lack its markers."""
    new = render(old, section(single, img_rel), optional=not single)
    return render(new, processes_section(multi, img_rel), P_BEGIN, P_END, optional=not multi)


def _style():
    """matplotlib with fixed settings (whatever the user's matplotlibrc says) and no backend with a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.style.context("default")


def _save(fig, path: Path) -> None:
    # no "Software" entry: the PNG's bytes then depend on the data alone, not on matplotlib's version string
    fig.savefig(path, dpi=100, metadata={"Software": None})


def plot_steps(rec: Result, path: Path) -> None:
    """Bars of the two sides' median step times, each block's per-step time as a point,
    and the arithmetic floor as a dashed line. The scale stops at 2.5 times the larger of
    the medians and the floor: a block that another process slowed tenfold would flatten
    the bars, so such a block is drawn as a triangle at the top, its time written beside it."""
    plt, style = _style()
    with style:
        fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
        sides = [("CPU eager", rec["cpu"], "tab:blue"), ("nntile", rec["nntile"], "tab:orange")]
        floor = rec["floor"]["ms"]
        cap = 2.5 * max(floor, *(s["median_ms"] for _, s, _ in sides))
        top = min(cap, 1.15 * max(floor, *(t for _, s, _ in sides for t in s["block_ms"])))
        block = f"each block of {rec['block']} step{'s' if rec['block'] > 1 else ''}"
        for i, (name, side, colour) in enumerate(sides):
            ax.bar(i, side["median_ms"], width=0.6, color=colour, alpha=0.55, label=f"{name}: median")
            blocks = side["block_ms"]
            n = len(blocks)
            xs = [i - 0.2 + 0.4 * k / (n - 1) for k in range(n)] if n > 1 else [i]
            inside = [(x, t) for x, t in zip(xs, blocks) if t <= top]
            ax.plot([x for x, _ in inside], [t for _, t in inside], "o", color=colour, markersize=4,
                    markeredgecolor="black", markeredgewidth=0.5, label=f"{name}: {block}")
            for x, t in zip(xs, blocks):
                if t > top:
                    ax.plot([x], [top], "^", color=colour, markersize=6, markeredgecolor="black", markeredgewidth=0.5,
                            clip_on=False)
                    ax.annotate(f"{ms(t)} ms", (x, top), xytext=(4, -3), textcoords="offset points", ha="left",
                                va="top", fontsize=7)
            ax.text(i, side["median_ms"] / 2, f"median\n{ms(side['median_ms'])} ms", ha="center", va="center",
                    fontsize=9, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})  # clear of the points
        ax.axhline(floor, color="black", linestyle="--", linewidth=1,
                   label=f"arithmetic floor {ms(floor)} ms ({rec['floor']['rate_gmac_s']:.0f} GMAC/s)")
        ax.set_xticks([0, 1], [s[0] for s in sides])
        ax.set_xlim(-0.6, 1.6)
        ax.set_ylim(0, top)
        ax.set_ylabel("ms per training step")
        ax.set_title(f"{textwrap.fill(command(rec), 90)}\nratio nntile/cpu {rec['ratio']:.2f}, nntile/floor "
                     f"{rec['floor']['nntile_over_floor']:.2f}\n{machine(rec)}, {rec['date'][:10]}", fontsize=9)
        fig.legend(fontsize=8, loc="outside lower center", ncols=3)
        _save(fig, path)
        plt.close(fig)


def plot_overview(results: list[Result], path: Path) -> None:
    """Each run's ratio nntile/cpu and nntile/floor as horizontal bars, with 1 marked: left of it nntile is ahead."""
    plt, style = _style()
    with style:
        n = len(results)
        fig, ax = plt.subplots(figsize=(8.0, 1.4 + 0.6 * n), layout="constrained")
        ys = list(range(n))[::-1]
        series = [("ratio nntile/cpu", lambda r: r["ratio"], "tab:orange", 0.18),
                  ("nntile/floor", lambda r: r["floor"]["nntile_over_floor"], "tab:gray", -0.18)]
        for name, get, colour, dy in series:
            vals = [get(r) for r in results]
            ax.barh([y + dy for y in ys], vals, height=0.34, color=colour, label=name)
            for y, v in zip(ys, vals):
                ax.annotate(f"{v:.2f}", (v, y + dy), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_yticks(ys, [textwrap.fill(command(r), 40) for r in results], fontsize=8)
        top = max(max(r["ratio"], r["floor"]["nntile_over_floor"]) for r in results)
        ax.set_xlim(0, 1.2 * max(top, 1.0))
        ax.set_xlabel("nntile's step time over eager's and over the floor (1: level)", fontsize=9)
        fig.legend(fontsize=8, loc="outside upper center", ncols=2)
        _save(fig, path)
        plt.close(fig)


def _bars(ax, xs, vals, fmt=lambda v: f"{v:.1f}", **kw) -> None:
    """Bars at ``xs`` (a missing value: no bar), each with its value written above it."""
    shown = [(x, v) for x, v in zip(xs, vals) if v is not None]
    ax.bar([x for x, _ in shown], [v for _, v in shown], **kw)
    for x, v in shown:
        ax.annotate(fmt(v), (x, v), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                    fontsize=7)


def plot_processes(rec: Result, path: Path) -> None:
    """Three panels over the process counts: rank 0's median step time (bars) with each
    block's time as a point; the bytes a rank sent a step (the most of any rank as bars,
    the mean as points) against a ring all-reduce's least (a dashed line); and the tiles
    a rank owns and holds (the most of any rank, bars side by side)."""
    plt, style = _style()
    runs = rec["runs"]
    xs = list(range(len(runs)))
    with style:
        fig, (step, sent, tiles) = plt.subplots(1, 3, figsize=(12.0, 4.4), layout="constrained")
        _bars(step, xs, [r["step_ms"] for r in runs], ms, width=0.6, color="tab:orange", alpha=0.55,
              label="rank 0: median")
        for x, r in zip(xs, runs):
            n = len(r["block_ms"])
            bx = [x - 0.2 + 0.4 * k / (n - 1) for k in range(n)] if n > 1 else [x]
            step.plot(bx, r["block_ms"], "o", color="tab:orange", markersize=4, markeredgecolor="black",
                      markeredgewidth=0.5, label="rank 0: each block" if x == 0 else None)
        step.set_ylabel("ms per training step")
        _bars(sent, xs, [r["sent_mib_max"] for r in runs], width=0.6, color="tab:blue", alpha=0.55,
              label="sent: the most of a rank")
        sent.plot(xs, [r["sent_mib_mean"] for r in runs], "o", color="tab:blue", markeredgecolor="black",
                  markeredgewidth=0.5, markersize=4, label="sent: mean of the ranks")
        sent.plot(xs, [r["ring_allreduce_mib"] for r in runs], "s--", color="black", linewidth=1, markersize=4,
                  label="ring all-reduce: least")
        sent.set_ylabel("MiB sent per rank per step")
        _bars(tiles, [x - 0.2 for x in xs], [r["owned_mib_max"] for r in runs], width=0.38, color="tab:green",
              label="owned")
        _bars(tiles, [x + 0.2 for x in xs], [r["held_mib_max"] for r in runs], width=0.38, color="tab:gray",
              label="held (owned and copies)")
        tiles.set_ylabel("MiB of tiles per rank (the most of a rank)")
        for ax in (step, sent, tiles):
            ax.set_xticks(xs, [str(r["ranks"]) for r in runs])
            ax.set_xlabel("processes")
            ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: clear of the bars
        fig.suptitle(f"{textwrap.fill(command(rec), 90)}: {rec.get('model') or '-'}, {rec.get('tiling') or '-'}\n"
                     f"{machine(rec)}, {rec['date'][:10]}", fontsize=9)
        _save(fig, path)
        plt.close(fig)


def check(old: str, new: str, page: Path, img_dir: Path, images: list[str]) -> int:
    """1 (and why, on stderr) when the page is not ``new`` or a plot is missing, else 0."""
    missing = [name for name in images if not (img_dir / name).is_file()]
    if new != old:
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(page),
                                                   "generated from the results", n=1))
        print(f"{page} is not what the results give: run benchmarks/report_pages.py", file=sys.stderr)
    if missing:
        print(f"plots missing from {img_dir}: {', '.join(missing)}", file=sys.stderr)
    return 1 if new != old or missing else 0


def plot_all(single: list[Result], multi: list[Result], img_dir: Path, images: list[str]) -> None:
    """Every plot the page links to, the stale ``bench-*.png`` removed."""
    img_dir.mkdir(parents=True, exist_ok=True)
    for stale in sorted(set(p.name for p in img_dir.glob("bench-*.png")) - set(images)):
        (img_dir / stale).unlink()
    if single:
        plot_overview(single, img_dir / OVERVIEW)
    for r in single:
        plot_steps(r, img_dir / image_name(r))
    for r in multi:
        plot_processes(r, img_dir / image_name(r))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="*", type=Path, help="result JSON files (default: benchmarks/results/*.json)")
    ap.add_argument("--page", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--img-dir", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--check", action="store_true", help="exit 1 if the page or its plots are not what the results give")
    args = ap.parse_args(argv)
    paths = sorted(args.results or (ROOT / "benchmarks" / "results").glob("*.json"))
    if not paths:
        ap.error("no result files")
    results = load(paths)
    single, multi = [r for r in results if "runs" not in r], [r for r in results if "runs" in r]
    img_rel = Path(os.path.relpath(args.img_dir.resolve(), args.page.resolve().parent)).as_posix()
    old = args.page.read_text() if args.page.exists() else ""
    new = page_text(old, single, multi, img_rel)
    images = [*([OVERVIEW] if single else []), *(image_name(r) for r in single + multi)]
    if args.check:
        return check(old, new, args.page, args.img_dir, images)
    plot_all(single, multi, args.img_dir, images)
    if new != old:
        args.page.write_text(new)
    print(f"{args.page}: {len(single)} single-process and {len(multi)} multi-process results; "
          f"plots in {args.img_dir}: {', '.join(images)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
