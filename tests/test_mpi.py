"""Several processes: ``python -m torch_nntile.launch`` runs a script on N ranks with
mpirun; ``init_context()`` joins the MPI world there (StarPU-MPI), and ``rank()`` /
``world_size()`` tell the ranks apart. Outside mpirun nothing changes. Real ranks, real
mpirun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import torch_nntile
from torch_nntile import launch

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None or not torch_nntile.built_with_mpi(),
                                reason="needs OpenMPI's mpirun and StarPU-MPI (the project's own StarPU build)")

SCRIPT = textwrap.dedent("""
    import sys, torch, torch_nntile
    before = (torch_nntile.rank(), torch_nntile.world_size())  # from the launcher, before init_context
    torch_nntile.init_context(ncpu=1)
    torch.manual_seed(0)
    a, b = torch.randn(40, 24), torch.randn(24, 8)
    an = a.to("nntile")
    torch_nntile.set_axis_group_name(an, {0: "rows"})
    torch_nntile.set_axis_group_tiling("rows", 16)
    err = ((an @ b.to("nntile")).relu().cpu() - (a @ b).relu()).abs().max().item()
    with open(f"{sys.argv[1]}/rank{torch_nntile.rank()}.txt", "w") as f:  # stdout: mpirun may mix the ranks' lines
        print(torch_nntile.rank(), torch_nntile.world_size(), *before, err, file=f)
    torch_nntile.shutdown_context()
""")


def _launch(tmp_path, n: int, script: str = SCRIPT) -> subprocess.CompletedProcess:
    path = tmp_path / "prog.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI"))}
    return subprocess.run([sys.executable, "-m", "torch_nntile.launch", "-n", str(n), str(path), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_launch_runs_the_script_on_every_rank(tmp_path, n):
    """Each rank joins the MPI world with its own workers, knows its rank before and after
    init_context, and gets CPU's values."""
    out = _launch(tmp_path, n)
    assert out.returncode == 0, out.stderr
    rows = [(tmp_path / f"rank{r}.txt").read_text().split() for r in range(n)]
    assert sorted(int(r[0]) for r in rows) == list(range(n))
    for r in rows:
        assert r[1] == str(n) and r[2] == r[0] and r[3] == str(n)
        assert float(r[4]) == 0.0


def test_a_failing_rank_fails_the_launch(tmp_path):
    out = _launch(tmp_path, 2, "import sys, torch_nntile\ntorch_nntile.init_context(ncpu=1)\n"
                               "sys.exit(3 if torch_nntile.rank() == 1 else 0)\n")
    assert out.returncode != 0


def test_outside_mpirun_one_rank():
    assert (torch_nntile.rank(), torch_nntile.world_size()) == (0, 1)  # the suite's context: no MPI world


def test_launch_command(monkeypatch):
    cmd = launch.command(4, "train.py", ["--steps", "2"])
    assert cmd[1:6] == ["-np", "4", "--oversubscribe", "--bind-to", "none"]
    assert cmd[-4:] == [sys.executable, "train.py", "--steps", "2"]
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="mpirun not found"):
        launch.command(2, "train.py", [])
    with pytest.raises(SystemExit):
        launch.main(["-n", "0", "train.py"])
