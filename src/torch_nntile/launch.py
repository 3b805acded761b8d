"""``python -m torch_nntile.launch -n N script.py [args]``: run a script on N processes
on this machine, as ``mpirun -np N python script.py [args]`` would.

Each process runs the whole script with its own StarPU workers; ``init_context()``
joins the MPI world (StarPU-MPI), and ``torch_nntile.rank()`` / ``world_size()`` tell
the processes apart. The options are those a run on one machine needs with OpenMPI:
more processes than cores allowed (``--oversubscribe``), no binding of a process to a
core (StarPU binds its own workers), and, for root, ``--allow-run-as-root``; and a free
port for ``torch.distributed``'s rendezvous (``MASTER_ADDR``, ``MASTER_PORT``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys


def command(nproc: int, script: str, args: list[str]) -> list[str]:
    """The mpirun command line that runs ``script`` on ``nproc`` processes."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("torch_nntile.launch: mpirun not found (install OpenMPI: apt-get install openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # torch.distributed's rendezvous (init_process_group("nntile")): this machine, a free port
    rdv = [] if "MASTER_PORT" in os.environ else ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={_free_port()}"]
    return [mpirun, "-np", str(nproc), "--oversubscribe", "--bind-to", "none", *root, *rdv, sys.executable, script,
            *args]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_nntile.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nproc", type=int, required=True, help="how many processes")
    ap.add_argument("script", help="the Python script each process runs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    opts = ap.parse_args(argv)
    if opts.nproc < 1:
        ap.error("-n must be at least 1")
    return subprocess.call(command(opts.nproc, opts.script, opts.args))


if __name__ == "__main__":
    sys.exit(main())
