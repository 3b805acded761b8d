"""``torch.distributed`` on nntile tensors: a process-group backend named ``"nntile"``.

Gloo refuses tensors of a PrivateUse1 device (pytorch/pytorch#184010), so a
``DistributedDataParallel`` script could not run on nntile. With this backend,
``init_process_group("nntile")`` in a script started by ``python -m torch_nntile.launch``
(or ``mpirun``) makes every rank a replica that keeps values of its own, as a process of
its own would; the collectives move tiles between the ranks with StarPU-MPI (a tile sent
is ordered after the tasks writing it, a tile received before the tasks reading it) and
combine them with ordinary recorded ops, so nothing waits on the host.

Reductions add the ranks' tiles in rank order on every rank: every rank gets the same
bits. Each rank sends its tiles to every other rank, (N - 1) times a tensor's bytes,
where a ring would send 2 (N - 1) / N: fine for the few ranks of one machine.
"""

from __future__ import annotations

import datetime
import itertools
import math
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from torch_nntile.backend.device import new_tensor, read
from torch_nntile.graph.nodes import SESSION, DataNode
from torch_nntile.session import SESSION_STATE
from torch_nntile.tiling.tiles import Given, TileArray

_TAG = 1 << 61  # above the tiles' tags and the ranks' checks (runtime/csrc/dist.c)
_TILES = 1 << 24  # tags a collective may use: one per tile and peer


def _done(result: Any) -> Any:
    """A finished ``Work``: the tiles' tasks and transfers are in StarPU's hands, ordered
    by their tiles; reading a result waits for them."""
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class ProcessGroupNntile(dist.ProcessGroup):
    """The ranks of the MPI world that ``init_context()`` joined, for nntile tensors."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._calls = itertools.count()

    def getBackendName(self) -> str:  # noqa: N802 - ProcessGroup's name
        return "nntile"

    # -- tiles --------------------------------------------------------------------------
    def _tiles(self, t: torch.Tensor) -> TileArray:
        """The tiles of ``t``'s current value, lowered and submitted."""
        if t.device.type != "nntile":
            raise ValueError(f"the nntile process group takes nntile tensors, got one on {t.device}")
        node = read(t.detach())
        if node.value is None or SESSION.pending:
            SESSION_STATE.execute()
        return node.value

    def _send(self, arr: TileArray, dest: int, call: int) -> None:
        lib = SESSION_STATE.runtime().lib
        for k, h in enumerate(arr.handles):
            lib.tnt_dist_send(h, dest, _TAG + call * _TILES + k)

    def _recv(self, like: TileArray, src: int, call: int) -> torch.Tensor:
        """A new tensor holding the value rank ``src`` sends, tiled as ``like``."""
        rt = SESSION_STATE.runtime()
        handles = rt.register_many([math.prod(shape) for _, _, shape in like.specs], like.dtype.itemsize)
        for k, h in enumerate(handles):
            rt.lib.tnt_dist_recv(h, src, _TAG + call * _TILES + k)
        node = DataNode(like.shape, like.dtype)
        node.value = TileArray(rt, like.shape, like.dtype, like.tiling, source=Given(handles))
        return new_tensor(node)

    def _send_others(self, arr: TileArray, call: int) -> None:
        for r in range(self._size):
            if r != self._rank:
                self._send(arr, r, call)

    def _gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t``, in rank order (this rank's is ``t`` itself)."""
        call = next(self._calls)
        arr = self._tiles(t)
        self._send_others(arr, call)
        return [t.detach() if r == self._rank else self._recv(arr, r, call) for r in range(self._size)]

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        op = opts.reduceOp if hasattr(opts, "reduceOp") else opts
        with torch.no_grad():
            for t in tensors:
                t.copy_(_reduce(self._gather(t), op))
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        root = opts.rootRank
        with torch.no_grad():
            for t in tensors:
                call = next(self._calls)
                arr = self._tiles(t)
                if self._rank == root:
                    self._send_others(arr, call)
                else:
                    t.copy_(self._recv(arr, root, call))
        return _done(tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any) -> Any:
        with torch.no_grad():
            for outs, t in zip(output_tensors, input_tensors, strict=True):
                for out, part in zip(outs, self._gather(t), strict=True):
                    out.copy_(part)
        return _done(output_tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """``all_gather_into_tensor``: the ranks' inputs, concatenated."""
        with torch.no_grad():
            output.copy_(torch.cat(self._gather(input)).view(output.shape))
        return _done(output)

    _allgather_base = all_gather_single  # the name torch's C++ callers use

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any) -> Any:
        with torch.no_grad():
            for out, parts in zip(output_tensors, input_tensors, strict=True):
                out.copy_(self._scatter_reduce(parts, opts.reduceOp))
        return _done(output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        """``reduce_scatter_tensor``: chunk r of every rank's input, reduced, to rank r."""
        with torch.no_grad():
            output.copy_(self._scatter_reduce(list(input.chunk(self._size)), opts.reduceOp).view(output.shape))
        return _done(output)

    _reduce_scatter_base = reduce_scatter_single

    def _scatter_reduce(self, parts: list[torch.Tensor], op: Any) -> torch.Tensor:
        """Part r of every rank goes to rank r; this rank's parts from all, reduced."""
        call = next(self._calls)
        mine = self._tiles(parts[self._rank])
        for r in range(self._size):
            if r != self._rank:
                self._send(self._tiles(parts[r].contiguous()), r, call)
        got = [parts[r].detach() if r == self._rank else self._recv(mine, r, call) for r in range(self._size)]
        return _reduce(got, op)

    def barrier(self, opts: Any = None) -> Any:
        rt = SESSION_STATE.runtime()
        rt.agree("barrier", [])
        return _done(None)


def _reduce(parts: list[torch.Tensor], op: Any) -> torch.Tensor:
    """The parts combined in rank order (the same bits on every rank)."""
    acc = parts[0].clone()
    for p in parts[1:]:
        if op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG:
            acc = acc + p
        elif op == dist.ReduceOp.PRODUCT:
            acc = acc * p
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, p)
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, p)
        else:
            raise ValueError(f"the nntile process group does not reduce with {op}")
    return acc / len(parts) if op == dist.ReduceOp.AVG else acc


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupNntile:
    """The backend's creator (``Backend.register_backend``): the MPI world that the
    runtime joined must be the group asked for."""
    rt = SESSION_STATE.runtime()
    if (rt.rank, rt.world_size) != (rank, size):
        raise RuntimeError(f"torch_nntile: init_process_group('nntile') asked for rank {rank} of {size}, but this "
                           f"process is rank {rt.rank} of {rt.world_size} of its MPI world: start the script with "
                           "python -m torch_nntile.launch or mpirun, and leave rank and world_size to them")
    rt.keep_replicas()
    return ProcessGroupNntile(rank, size)


def register() -> None:
    """Make ``init_process_group("nntile")`` available (once)."""
    if "NNTILE" not in dist.Backend._plugins:
        dist.Backend.register_backend("nntile", _create, devices=["nntile"])  # a list: a string is split in letters
