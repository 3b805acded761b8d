"""Every ```python block of README.md and docs/**/*.md runs, so the documentation cannot rot.

Convention for the Markdown files:

- Only fences whose info string is exactly ``python`` or ``py`` run; ``pycon``, ``text``,
  ``sh``, ``bash`` and the rest are left alone.
- The blocks of one file run in order as one script, like a reader following the page:
  a later block may use names an earlier one made. Each file gets a fresh interpreter
  (``sys.executable``) with the repository root as working directory, a temporary
  ``STARPU_HOME`` of its own and ``TIMEOUT_S`` seconds.
- ``<!-- skip: REASON -->`` on the line immediately before an opening fence (no blank
  line between) leaves that block out. REASON must not be empty, and a marker that is
  not right before a runnable fence is an error as well: it would skip nothing.
- A failure names the file and the opening-fence line of the block that failed; the
  traceback shows the Markdown file's own line numbers (each block is compiled under
  the file's name at its offset).

``python tests/test_docs.py --count`` prints how many blocks run and how many are
skipped, per file and in total. This module imports neither torch nor torch_nntile.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120  # per Markdown file
RUNNABLE = frozenset({"python", "py"})
_TAIL_CHARS = 4000

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_SKIP = re.compile(r"^\s*<!--\s*skip\b(?P<rest>.*?)-->\s*$")
_MARK = "@@docs-block "

# Runs in the child: the blocks arrive as JSON on stdin (so a block reading stdin gets
# EOF instead of hanging), share one namespace, and each is preceded by a marker on
# stderr that tells the parent which block was running when it failed or hung.
_DRIVER = f"""
import json, sys, traceback
blocks = json.load(sys.stdin)
ns = {{"__name__": "__main__"}}
for b in blocks:
    print("{_MARK}" + str(b["line"]), file=sys.stderr, flush=True)
    code = compile("\\n" * b["line"] + b["source"], b["file"], "exec")
    try:
        exec(code, ns)
    except Exception as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)
"""


class MarkerError(ValueError):
    """A skip marker that is malformed or misplaced (it must never silently skip nothing)."""


class DocsBlockError(AssertionError):
    """A documentation block raised, exited non-zero or outlived the timeout."""


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    source: str
    skip: str | None = None  # the reason, for a block that does not run


def parse(text: str, name: str = "<markdown>") -> list[Block]:
    """The ```python / ```py blocks of ``text``, skipped ones with their reason."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        skip = _SKIP.match(lines[i])
        if skip:
            rest = skip["rest"].strip()
            reason = rest[1:].strip() if rest.startswith(":") else ""
            if not reason:
                raise MarkerError(f"{name}:{i + 1}: a skip marker needs a reason: <!-- skip: REASON -->")
            nxt = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if nxt is None or nxt["info"].strip() not in RUNNABLE:
                raise MarkerError(f"{name}:{i + 1}: a skip marker must be on the line immediately before "
                                  "a ```python fence")
            i += 1
            fence_reason: str | None = reason
        else:
            fence_reason = None
        m = _FENCE.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        start, indent, fence, info = i, len(m["indent"]), m["fence"], m["info"].strip()
        body: list[str] = []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                break
            body.append(re.sub(rf"^ {{0,{indent}}}", "", lines[i]))
            i += 1
        i += 1  # past the closing fence (or the end: an unclosed fence runs to the end)
        if info in RUNNABLE:
            blocks.append(Block(start + 1, "\n".join(body) + "\n", fence_reason))
    return blocks


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file()]


def _display(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _tail(stderr: str) -> str:
    text = "\n".join(ln for ln in stderr.splitlines() if not ln.startswith(_MARK))
    return text[-_TAIL_CHARS:]


def _last_block(stderr: str) -> str:
    marks = [ln[len(_MARK):] for ln in stderr.splitlines() if ln.startswith(_MARK)]
    return marks[-1] if marks else "?"


def check_markdown(path: Path, root: Path = ROOT, timeout: float = TIMEOUT_S) -> int:
    """Run the runnable blocks of ``path`` as one script; return how many ran, raise
    ``DocsBlockError`` naming the failing block's line."""
    name = _display(path, root)
    blocks = [b for b in parse(path.read_text(encoding="utf-8"), name) if b.skip is None]
    if not blocks:
        return 0
    payload = json.dumps([{"line": b.line, "source": b.source, "file": name} for b in blocks])
    with tempfile.TemporaryDirectory(prefix="docs_starpu_") as starpu_home:
        env = {**os.environ, "STARPU_HOME": starpu_home}
        env.setdefault("STARPU_SILENT", "1")
        env.setdefault("MPLBACKEND", "Agg")
        try:
            proc = subprocess.run([sys.executable, "-c", _DRIVER], input=payload, cwd=root, env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise DocsBlockError(f"{name}: the block at line {_last_block(err)} did not finish within {timeout} s "
                                 f"(all blocks of a file share the limit)\n--- stderr tail ---\n{_tail(err)}") from None
    if proc.returncode != 0:
        raise DocsBlockError(f"{name}: the block at line {_last_block(proc.stderr)} failed "
                             f"(exit status {proc.returncode})\n--- stderr tail ---\n{_tail(proc.stderr)}")
    return len(blocks)


def count(root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """Per file with a python block: (blocks that run, blocks skipped). Raises ``MarkerError``."""
    out: dict[str, tuple[int, int]] = {}
    for path in markdown_files(root):
        blocks = parse(path.read_text(encoding="utf-8"), _display(path, root))
        if blocks:
            skipped = sum(b.skip is not None for b in blocks)
            out[_display(path, root)] = (len(blocks) - skipped, skipped)
    return out


def _page_params() -> list[object]:
    """One param per file that has a block to run, or a marker error to report."""
    params = []
    for path in markdown_files():
        name = _display(path, ROOT)
        try:
            runs = any(b.skip is None for b in parse(path.read_text(encoding="utf-8"), name))
        except MarkerError:
            runs = True  # the test reports it
        if runs:
            params.append(pytest.param(path, id=name))
    return params


@pytest.mark.parametrize("path", _page_params())
def test_docs_page(path: Path) -> None:
    try:
        check_markdown(path)
        failure = None
    except (DocsBlockError, MarkerError) as e:
        failure = str(e)
    if failure:  # outside the except: the block's own traceback is the message, nothing chained to it
        pytest.fail(failure, pytrace=False)


def test_docs_blocks_exist() -> None:
    """The docs test must never pass by running nothing."""
    per_file = count()
    assert sum(run for run, _ in per_file.values()) >= 1, f"no runnable ```python block in the docs: {per_file}"


def test_api_reference_lists_all() -> None:
    """docs/reference/api.md renders every name of ``torch_nntile.__all__`` (read statically)."""
    tree = ast.parse((ROOT / "src/torch_nntile/__init__.py").read_text(encoding="utf-8"))
    names = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets))
    page = (ROOT / "docs/reference/api.md").read_text(encoding="utf-8")
    missing = [n for n in names if not re.search(rf"^::: torch_nntile\.{re.escape(n)}\s*$", page, re.M)]
    assert not missing, f"docs/reference/api.md has no ::: directive for {missing}"


# -- the runner itself, on small pages ---------------------------------------------------------

_PAGE = """# A page

```python
x = 20
```

Text, then a block that would fail but is only shown:

```pycon
>>> raise RuntimeError("not run")
```

```text
not python
```

<!-- skip: needs a model that is not here -->
```python
raise RuntimeError("skipped, so not run")
```

1. A list item with an indented block:

    ```py
    y = x + 1
    ```

```python
assert (x, y) == (20, 21), (x, y)
print("ok")
```
"""


def _write(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return page


def test_runner_runs_blocks_in_order(tmp_path: Path) -> None:
    blocks = parse(_PAGE)
    assert [(b.line, b.skip) for b in blocks] == [(3, None), (18, "needs a model that is not here"), (24, None),
                                                  (28, None)]
    assert blocks[2].source == "y = x + 1\n"
    assert check_markdown(_write(tmp_path, _PAGE), root=tmp_path) == 3


def test_runner_names_the_failing_block(tmp_path: Path) -> None:
    text = _PAGE + "\nMore text.\n\n```python\nz = 1\n\nraise ValueError('boom in the docs')\n```\n"
    with pytest.raises(DocsBlockError) as e:
        check_markdown(_write(tmp_path, text), root=tmp_path)
    msg = str(e.value)
    assert "page.md: the block at line 35 failed" in msg, msg
    assert 'File "page.md", line 38' in msg and "ValueError: boom in the docs" in msg, msg
    assert "raise ValueError('boom in the docs')" in msg, msg  # the source line, read from the Markdown file


def test_runner_names_a_hanging_block(tmp_path: Path) -> None:
    page = _write(tmp_path, "```python\nx = 1\n```\n\n```python\nimport time\ntime.sleep(60)\n```\n")
    with pytest.raises(DocsBlockError, match="the block at line 5 did not finish within 2 s"):
        check_markdown(page, root=tmp_path, timeout=2)


@pytest.mark.parametrize("marker", ["<!-- skip: -->", "<!-- skip -->", "<!--skip:   -->"])
def test_skip_without_reason_is_rejected(tmp_path: Path, marker: str) -> None:
    page = _write(tmp_path, f"# Page\n\n{marker}\n```python\nx = 1\n```\n")
    with pytest.raises(MarkerError, match=r"page.md:3: a skip marker needs a reason"):
        check_markdown(page, root=tmp_path)


@pytest.mark.parametrize("text", [
    "<!-- skip: a reason -->\n\n```python\nx = 1\n```\n",  # a blank line between
    "<!-- skip: a reason -->\n```text\nx = 1\n```\n",  # not a runnable fence
    "<!-- skip: a reason -->\nSome prose.\n",
])
def test_misplaced_skip_is_rejected(tmp_path: Path, text: str) -> None:
    with pytest.raises(MarkerError, match=r"page.md:1: a skip marker must be on the line immediately before"):
        check_markdown(_write(tmp_path, text), root=tmp_path)


def test_marker_inside_a_fence_is_text() -> None:
    """A page may show the convention itself in a non-Python fence."""
    text = "````markdown\n<!-- skip: why -->\n```python\nx = 1\n```\n````\n"
    assert parse(text) == []


def _print_count() -> int:
    try:
        per_file = count()
    except MarkerError as e:
        print(e, file=sys.stderr)
        return 1
    width = max((len(n) for n in per_file), default=5)
    for name, (run, skipped) in per_file.items():
        print(f"{name:<{width}}  {run:3d} run  {skipped:3d} skipped")
    print(f"{'total':<{width}}  {sum(r for r, _ in per_file.values()):3d} run  "
          f"{sum(s for _, s in per_file.values()):3d} skipped")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--count"]:
        sys.exit(f"usage: {sys.argv[0]} --count   (the tests run under pytest)")
    sys.exit(_print_count())
