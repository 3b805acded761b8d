"""Several processes: ``python -m torch_nntile.launch`` runs a script on N ranks with
mpirun; ``init_context()`` joins the MPI world there (StarPU-MPI), and ``rank()`` /
``world_size()`` tell the ranks apart. Outside mpirun nothing changes. Real ranks, real
mpirun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

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


def _launch(tmp_path, n: int, script: str = SCRIPT, extra: dict[str, str] | None = None,
            args: list[str] | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "prog.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI"))} | (extra or {})
    return subprocess.run([sys.executable, "-m", "torch_nntile.launch", "-n", str(n), str(path), str(tmp_path),
                           *(args or [])], env=env, capture_output=True, text=True, timeout=180)


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


SGD_STEPS = """opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
losses = []
for _ in range(3):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())"""


def _with_steps(script: str) -> str:
    """``script`` with its line ``SGD_STEPS`` replaced by three SGD steps of ``model`` on
    ``x`` and ``y`` (their losses in ``losses``), at that line's indent."""
    lines = []
    for line in script.split("\n"):
        if line.strip() == "SGD_STEPS":
            lines.append(textwrap.indent(SGD_STEPS, line[:len(line) - len(line.lstrip())]))
        else:
            lines.append(line)
    return "\n".join(lines)


TRAIN = _with_steps(textwrap.dedent("""
    import json, sys, torch, torch_nntile
    from torch_nntile.report import info
    from transformers import GPT2Config, GPT2LMHeadModel
    torch_nntile.init_context(ncpu=1)
    out, results = sys.argv[1], {}

    def mlp(group):
        # bias-free ReLU MLP, batch 96: its batch tiled unevenly, or its hidden dim (tensor parallel)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 48, bias=False), torch.nn.ReLU(),
                                    torch.nn.Linear(48, 48, bias=False), torch.nn.ReLU(),
                                    torch.nn.Linear(48, 10, bias=False)).to("nntile")
        x, y = torch.randn(96, 32).to("nntile"), torch.randint(0, 10, (96,)).to("nntile")
        torch_nntile.set_axis_group_name(x, {0: "batch"})
        torch_nntile.set_axis_group_name(model[0].weight, {0: "hidden"})
        torch_nntile.set_axis_group_tiling(group, [40, 32, 24] if group == "batch" else 16)
        SGD_STEPS
        torch_nntile.set_axis_group_tiling(group, None)
        return losses, model

    def gpt2():
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64,
                         attn_implementation="eager", bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg).to("nntile")
        ids = torch.randint(0, 1000, (8, 64)).to("nntile")
        torch_nntile.set_axis_group_name(ids, {0: "batch", 1: "seq"})
        model.get_input_embeddings().register_forward_hook(
            lambda mod, a, o: torch_nntile.set_axis_group_name(o, {0: "batch", 1: "seq"}))
        torch_nntile.set_axis_group_tiling("batch", 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(10):
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    for name, run in (("mlp-batch", lambda: mlp("batch")), ("mlp-hidden", lambda: mlp("hidden")), ("gpt2", gpt2)):
        torch_nntile.reset_info()
        losses, model = run()
        if name == "gpt2" and torch_nntile.rank() == 0:  # rank 0 alone reads the weights: the others send theirs
            model.save_pretrained(f"{out}/saved_{torch_nntile.world_size()}")
        weights = [p.detach().cpu() for p in model.parameters()]
        results[name] = {"losses": losses, "mpi": info()["mpi"]}
        torch.save(weights, f"{out}/{name}_{torch_nntile.world_size()}_{torch_nntile.rank()}.pt")
    with open(f"{out}/train_{torch_nntile.world_size()}_{torch_nntile.rank()}.json", "w") as f:
        json.dump(results, f)
    torch_nntile.shutdown_context()
"""))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The three trainings over 1, 2 and 3 ranks (products pack nothing in one process
    either, so that the kernels are the same everywhere)."""
    tmp = tmp_path_factory.mktemp("train")
    for n in (1, 2, 3):
        out = _launch(tmp, n, TRAIN, {"TORCH_NNTILE_NO_PACK": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
    return tmp


@pytest.mark.parametrize("name", ["mlp-batch", "mlp-hidden", "gpt2"])
@pytest.mark.parametrize("n", [2, 3])
def test_distributed_training_matches_one_process(trained, name, n):
    """Tiles spread over n ranks (the batch tiles, or the MLP's hidden tiles): every rank
    gets the losses and weights of one process, within 1e-6 relative (the task graph is the
    same, only where each task runs differs); each rank ran part of the tasks and the
    bytes one rank sent the others received."""
    one = json.loads((trained / "train_1_0.json").read_text())[name]
    want_w = torch.load(trained / f"{name}_1_0.pt")
    sent = received = 0
    for r in range(n):
        got = json.loads((trained / f"train_{n}_{r}.json").read_text())[name]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(one["losses"]), rtol=1e-6, atol=0)
        for w, v in zip(torch.load(trained / f"{name}_{n}_{r}.pt"), want_w, strict=True):
            torch.testing.assert_close(w, v, rtol=1e-6, atol=1e-6)
        m = got["mpi"]
        assert (m["rank"], m["world_size"]) == (r, n)
        assert m["tasks_here"] > 0 and m["tasks_elsewhere"] > 0
        sent, received = sent + m["bytes_sent"], received + m["bytes_received"]
    assert one["mpi"] is None  # one process: nothing distributed
    assert sent == received > 0


FAULT = textwrap.dedent("""
    import os, sys, time, torch, torch_nntile
    torch_nntile.init_context(ncpu=1)
    mode = sys.argv[2]
    x = torch.randn(64, 16).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", 16)
    (x * 2).sum().item()
    if torch_nntile.rank() == 1:
        if mode == "raise":
            raise RuntimeError("a failure on purpose")
        if mode == "exit":
            sys.exit(0)
        if mode == "kill":
            os.kill(os.getpid(), 9)
        if mode == "other op":
            x = x + 1
        if mode == "late":
            time.sleep(60)
    if mode == "read on rank 0" and torch_nntile.rank() == 0:
        (x * 5).sum().item()
    if mode == "read a dropped value":
        v = x * 4
        v.sum().item()
        if torch_nntile.rank() == 1:
            del v
        y = (x * 3).sum()
        if torch_nntile.rank() == 0:
            v.cpu()
        y.item()
    (x * 3).sum().item()
""")

FAULTS = {  # what every rank does otherwise, what rank 1 does: what the launch must say
    "raise": "rank 1 of 2 stopped on RuntimeError; stopping every rank",
    "exit": "the ranks' programs diverged at check #3: rank 0: compile; rank 1: shutdown",
    "kill": "exited on signal 9",
    "other op": "diverged at compile #3, op 1: rank 0: mul",
    "read on rank 0": "diverged at compile #3, op 1: rank 0: mul(call_out(_VariableFunctionsClass.mul,(),(TileSlot,5))",
    "late": "rank 0 of 2: the other ranks did not reach compile #3 within 10 s",
    "read a dropped value": "rank 0 read a value (a value of shape [64, 16] and dtype torch.float32) alone, and "
                            "rank(s) [1] no longer hold its tiles (they were at: readout)",
}


@pytest.mark.parametrize("mode", list(FAULTS))
def test_a_rank_that_fails_or_diverges_stops_every_rank(tmp_path, mode):
    """A rank that raises, exits early, is killed, records another op, reads a value the
    others do not, or does not arrive within TORCH_NNTILE_MPI_TIMEOUT: every rank stops
    with an error naming what happened, instead of waiting for the others forever."""
    # a short wait only where a rank is late on purpose: elsewhere a slow machine must not look like a late rank
    out = _launch(tmp_path, 2, FAULT, {"TORCH_NNTILE_MPI_TIMEOUT": "10" if mode == "late" else "120"}, [mode])
    assert out.returncode != 0
    assert FAULTS[mode] in out.stdout + out.stderr, out.stderr[-3000:]


@pytest.mark.parametrize("n", [2, 3])
def test_save_pretrained_on_rank_0_alone_writes_the_whole_model(trained, n):
    """GPT-2 trained over n ranks, saved by rank 0 alone (the other ranks, at their next
    check, send it the tiles they own): the files hold one process's weights."""
    from safetensors.torch import load_file

    want = load_file(trained / "saved_1" / "model.safetensors")
    got = load_file(trained / f"saved_{n}" / "model.safetensors")
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6)


VETH = _with_steps(textwrap.dedent("""
    import json, sys, torch, torch_nntile
    from torch_nntile.report import info
    torch_nntile.init_context(ncpu=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(48, 10, bias=False)).to("nntile")
    x, y = torch.randn(96, 32).to("nntile"), torch.randint(0, 10, (96,)).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", 24)
    SGD_STEPS
    w = [p.detach().cpu().tolist() for p in model.parameters()]
    with open(f"{sys.argv[1]}/veth_{torch_nntile.world_size()}_{torch_nntile.rank()}.json", "w") as f:
        json.dump({"losses": losses, "w": w, "mpi": info()["mpi"]}, f)
"""))

# mpirun's remote-shell agent: "agent [options] host command...": each host runs in its namespace
AGENT = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
case "$host" in
  {ip1}) exec ip netns exec {ns1} sh -c "$*" ;;
  *) exec ip netns exec {ns0} sh -c "$*" ;;
esac
"""


@pytest.fixture
def two_hosts(tmp_path):
    """Two network namespaces joined by a veth pair, 10.231.<k>.1 and .2: two hosts on
    one machine, whose MPI traffic crosses a network interface. Made here, removed after."""
    k = os.getpid() % 200 + 20
    ns, dev = [f"tnt{k}n{i}" for i in (0, 1)], [f"tnt{k}v{i}" for i in (0, 1)]
    ips = [f"10.231.{k}.{i + 1}" for i in (0, 1)]
    ip = shutil.which("ip")

    def sh(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([ip, *cmd], capture_output=True, text=True)

    if ip is None or os.geteuid() != 0 or sh("netns", "add", ns[0]).returncode != 0:
        pytest.skip("needs root, iproute2 and the right to make network namespaces")
    try:
        steps = [("netns", "add", ns[1]), ("link", "add", dev[0], "type", "veth", "peer", "name", dev[1])]
        for i in (0, 1):
            steps += [("link", "set", dev[i], "netns", ns[i]),
                      ("netns", "exec", ns[i], "ip", "addr", "add", f"{ips[i]}/24", "dev", dev[i]),
                      ("netns", "exec", ns[i], "ip", "link", "set", dev[i], "up"),
                      ("netns", "exec", ns[i], "ip", "link", "set", "lo", "up")]
        for step in steps:
            out = sh(*step)
            assert out.returncode == 0, (step, out.stderr)
        agent = tmp_path / "agent.sh"
        agent.write_text(AGENT.format(ip1=ips[1], ns0=ns[0], ns1=ns[1]))
        agent.chmod(0o755)
        (tmp_path / "hosts").write_text(f"{ips[0]} slots=1\n{ips[1]} slots=1\n")
        yield {"ns": ns, "dev": dev, "ips": ips, "agent": agent, "hosts": tmp_path / "hosts", "net": f"10.231.{k}.0/24"}
    finally:
        for n in ns:
            sh("netns", "del", n)  # takes its end of the veth pair with it


def test_two_ranks_in_two_network_namespaces(tmp_path, two_hosts):
    """Rank 0 and rank 1 in namespaces of their own, each with its own address, joined by
    a veth pair: StarPU-MPI's traffic goes over OpenMPI's TCP transport on that interface,
    as between two hosts. The MLP trained data-parallel gets one process's numbers, and
    the interface carried at least the bytes of tiles rank 1 received."""
    h = two_hosts
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI"))} | {"TORCH_NNTILE_NO_PACK": "1"}
    path = tmp_path / "prog.py"
    path.write_text(VETH)
    net = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", h["net"], "--mca", "oob_tcp_if_include", h["net"]]
    out = subprocess.run(["ip", "netns", "exec", h["ns"][0], "mpirun", "--allow-run-as-root", "--hostfile", str(h["hosts"]),
                          "-np", "2", "--mca", "plm_rsh_agent", str(h["agent"]), *net, sys.executable, str(path),
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    one = _launch(tmp_path, 1, VETH, {"TORCH_NNTILE_NO_PACK": "1"})
    assert one.returncode == 0, one.stderr[-3000:]
    want = json.loads((tmp_path / "veth_1_0.json").read_text())
    got = [json.loads((tmp_path / f"veth_2_{r}.json").read_text()) for r in (0, 1)]
    for g in got:
        assert g["losses"] == want["losses"] and g["w"] == want["w"]
    rx = subprocess.run(["ip", "netns", "exec", h["ns"][1], "cat", f"/sys/class/net/{h['dev'][1]}/statistics/rx_bytes"],
                        capture_output=True, text=True)
    assert got[1]["mpi"]["bytes_received"] > 0
    assert int(rx.stdout) >= got[1]["mpi"]["bytes_received"]


DDP_SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist, torch_nntile
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("nntile")  # unchanged: the launcher set the rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    nn = lambda t: t.to("nntile")
    t = nn(torch.arange(6, dtype=torch.float32) + rank)
    dist.all_reduce(t)
    m = nn(torch.tensor([1.0, -2.0]) * (rank + 1))
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    b = nn(torch.full((3,), float(rank)))
    dist.broadcast(b, src=world - 1)
    outs = [nn(torch.zeros(2)) for _ in range(world)]
    dist.all_gather(outs, nn(torch.full((2,), float(rank))))
    rs = nn(torch.zeros(2))
    dist.reduce_scatter(rs, [nn(torch.full((2,), float(rank * 10 + q))) for q in range(world)])
    avg = nn(torch.full((2,), float(rank)))
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    cat = nn(torch.zeros(2 * world))
    dist.all_gather_into_tensor(cat, nn(torch.full((2,), float(rank))))
    rst = nn(torch.zeros(2))
    dist.reduce_scatter_tensor(rst, nn(torch.arange(2 * world, dtype=torch.float32) + 10 * rank))
    dist.barrier()
    got = {"all_reduce": t.cpu().tolist(), "max": m.cpu().tolist(), "broadcast": b.cpu().tolist(),
           "all_gather": [o.cpu().tolist() for o in outs], "reduce_scatter": rs.cpu().tolist(),
           "avg": avg.cpu().tolist(), "all_gather_into_tensor": cat.cpu().tolist(),
           "reduce_scatter_tensor": rst.cpu().tolist()}
    torch.manual_seed(0)
    model = nn(torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10)))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(96, 32, generator=g), torch.randint(0, 10, (96,), generator=g)
    n = 96 // world  # each rank its own shard of the batch
    x, y = nn(X[rank * n:(rank + 1) * n]), nn(Y[rank * n:(rank + 1) * n])
    got["losses"] = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        got["losses"].append(loss.item())
    got["w"] = [p.detach().cpu().tolist() for p in model.parameters()]
    with open(f"{sys.argv[1]}/ddp_{world}_{rank}.json", "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("n", [2, 3])
def test_torch_distributed_and_ddp_on_nntile(tmp_path, n):
    """init_process_group("nntile"): all_reduce (sum, max, average), broadcast,
    all_gather (into a list and into a tensor), reduce_scatter (from a list and from a
    tensor) and barrier on nntile tensors give what the ranks' values give; an
    unchanged DistributedDataParallel script, each rank on its shard of the batch, gets
    one process's full-batch losses (the mean of the ranks') and weights, the same on
    every rank."""
    out = _launch(tmp_path, n, DDP_SCRIPT)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"ddp_{n}_{r}.json").read_text()) for r in range(n)]
    for r, got in enumerate(ranks):
        assert got["all_reduce"] == [n * i + n * (n - 1) / 2 for i in range(6)]
        assert got["max"] == [float(n), -2.0]
        assert got["broadcast"] == [float(n - 1)] * 3
        assert got["all_gather"] == [[float(q)] * 2 for q in range(n)]
        assert got["reduce_scatter"] == [float(sum(q * 10 + r for q in range(n)))] * 2
        assert got["avg"] == [(n - 1) / 2] * 2
        assert got["all_gather_into_tensor"] == [float(q) for q in range(n) for _ in range(2)]
        assert got["reduce_scatter_tensor"] == [float(sum(10 * q + 2 * r + i for q in range(n))) for i in range(2)]
        assert got["w"] == ranks[0]["w"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(96, 32, generator=g), torch.randint(0, 10, (96,), generator=g)
    for step in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X), Y)
        loss.backward()
        opt.step()
        mean = sum(got["losses"][step] for got in ranks) / n
        assert abs(mean - loss.item()) <= 1e-6 * abs(loss.item())
    for p, w in zip(model.parameters(), ranks[0]["w"], strict=True):
        torch.testing.assert_close(torch.tensor(w), p.detach(), rtol=1e-5, atol=1e-6)


EDGES = textwrap.dedent("""
    import json, sys, torch, torch_nntile
    torch_nntile.init_context(ncpu=1)
    z = torch.empty(0, 4).to("nntile")
    torch_nntile.set_axis_group_name(z, {1: "cols"})
    torch_nntile.set_axis_group_tiling("cols", 2)  # a zero-size value in two tiles: nothing is ever written
    got = {"zero": list((z * 2 + 1).cpu().shape), "sum": z.sum(0).cpu().tolist(),
           "scalar": (torch.tensor(3.0).to("nntile") * 2).cpu().item()}
    with open(f"{sys.argv[1]}/edges_{torch_nntile.rank()}.json", "w") as f:
        json.dump(got, f)
""")


def test_zero_size_and_0_dim_values_over_two_ranks(tmp_path):
    """Over two ranks a zero-size value (tiled: tiles no task writes) and a 0-dim one read
    back as on CPU on every rank."""
    out = _launch(tmp_path, 2, EDGES)
    assert out.returncode == 0, out.stderr[-3000:]
    for r in (0, 1):
        assert json.loads((tmp_path / f"edges_{r}.json").read_text()) == {"zero": [0, 4], "sum": [0.0] * 4,
                                                                          "scalar": 6.0}


def test_a_failing_rank_fails_the_launch(tmp_path):
    out = _launch(tmp_path, 2, "import sys, torch_nntile\ntorch_nntile.init_context(ncpu=1)\n"
                               "sys.exit(3 if torch_nntile.rank() == 1 else 0)\n")
    assert out.returncode != 0


def test_outside_mpirun_one_rank():
    assert (torch_nntile.rank(), torch_nntile.world_size()) == (0, 1)  # the suite's context: no MPI world


def test_launch_command(monkeypatch):
    cmd = launch.command(4, "train.py", ["--steps", "2"])
    assert cmd[1:6] == ["-np", "4", "--oversubscribe", "--bind-to", "none"]
    assert any(a.startswith("MASTER_PORT=") for a in cmd) or "MASTER_PORT" in os.environ
    assert cmd[-4:] == [sys.executable, "train.py", "--steps", "2"]
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="mpirun not found"):
        launch.command(2, "train.py", [])
    with pytest.raises(SystemExit):
        launch.main(["-n", "0", "train.py"])
