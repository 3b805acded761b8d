"""Run the default test suite several times, each time beside a second copy of it.

A test that reads a counter or a state while asynchronous work still changes it
passes on an idle machine and fails now and then on a busy one. Two copies of the
suite at once keep the cores busy the whole time, so such tests show up here. Each
round runs both copies (separate STARPU_HOME and pytest temp folders); a round passes
when both do. Prints one line per round and the figure; exits 1 unless every round
passed. Logs of failed copies are kept in the --logs folder.

    python scripts/stress.py [--rounds 10] [--logs .stress] [-- extra pytest arguments]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time


def _start(tmp: str, which: str, log: str, extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ)
    home = os.path.join(tmp, which)
    os.makedirs(home, exist_ok=True)
    env["STARPU_HOME"] = os.path.join(home, "starpu")
    env.setdefault("STARPU_SILENT", "1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={home}/pytest", *extra]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def _failures(log: str) -> list[str]:
    with open(log) as f:
        lines = f.read().splitlines()
    bad = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return bad or lines[-3:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--logs", default=".stress", help="folder for the logs of failed copies")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(args.logs, exist_ok=True)
    passed = 0
    with tempfile.TemporaryDirectory(prefix="torch_nntile_stress_") as tmp:
        for r in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            logs = {w: os.path.join(args.logs, f"round{r:02d}_{w}.log") for w in ("main", "beside")}
            procs = {w: _start(os.path.join(tmp, f"r{r}"), w, logs[w], args.pytest_args) for w in logs}
            try:
                rcs = {w: p.wait() for w, p in procs.items()}
            finally:  # interrupted (Ctrl-C, SIGTERM): take the two copies down too
                for p in procs.values():
                    if p.poll() is None:
                        p.kill()
            ok = all(rc == 0 for rc in rcs.values())
            passed += ok
            state = ", ".join(f"{w} {'passed' if rc == 0 else f'FAILED (exit {rc})'}" for w, rc in rcs.items())
            print(f"round {r:2d}/{args.rounds}: {state}  [{time.perf_counter() - t0:.0f} s]", flush=True)
            for w, rc in rcs.items():
                if rc == 0:
                    os.remove(logs[w])
                else:
                    for ln in _failures(logs[w]):
                        print(f"    {w}: {ln}", flush=True)
    print(f"stress: {passed}/{args.rounds} rounds passed (each: the suite and a second copy beside it)")
    return 0 if passed == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
