"""Importing torch_nntile makes nntile the process's accelerator; the ordinary CPU paths
that consult the current accelerator (pinning, loading, RNG state) keep working, and
``torch.nntile`` answers as ``torch.cuda`` does where the meaning carries over (memory,
synchronize, seeds, the device's name and properties)."""

from __future__ import annotations

import collections
import gc
import io
import os

import pytest
import torch
from conftest import run_python
from torch.utils.data import DataLoader, TensorDataset

import torch_nntile
from torch_nntile.session import SESSION_STATE


def test_nntile_is_the_current_accelerator():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("nntile")
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    with torch.nntile.device(0):
        assert torch.randn(2, device="nntile").device == torch.device("nntile", 0)


def test_dataloader_pins_cpu_batches():
    ds = TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    batches = list(DataLoader(ds, batch_size=4, pin_memory=True))
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5]]
    torch.testing.assert_close(batches[0][0], torch.arange(8.0).reshape(4, 2), rtol=0, atol=0)
    assert all(t.is_pinned() and t.device.type == "cpu" for b in batches for t in b)


@pytest.mark.parametrize("shape", [(3, 5), (0, 4), ()])
def test_pin_memory_copies_into_pinned_host_memory(shape):
    x = torch.randn(shape)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.device.type == "cpu" and p.shape == x.shape
    if x.numel():  # no bytes, no block: an empty tensor is never pinned, as with CUDA
        assert p.is_pinned() and p.data_ptr() != x.data_ptr()
    torch.testing.assert_close(p, x, rtol=0, atol=0)
    e = torch.empty(4, 3, pin_memory=True)
    assert e.is_pinned() and e.shape == (4, 3)
    assert e[1:].is_pinned()  # a view of pinned memory is pinned
    del p, e  # freeing pinned blocks forgets them
    assert not torch.zeros(64).is_pinned()


def _saved(obj: object) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("where", ["nntile", "nntile:0", torch.device("nntile"), {"cpu": "nntile"}])
def test_load_maps_cpu_checkpoints_onto_nntile(where):
    w = torch.randn(4, 3)
    sd = collections.OrderedDict(w=w, tied=w, b=torch.arange(5), empty=torch.zeros(0, 2))
    sd._metadata = {"": {"version": 1}}
    p = torch.nn.Parameter(torch.randn(2))
    loaded = torch.load(_saved({"sd": sd, "p": p, "n": 3}), map_location=where)
    out = loaded["sd"]
    assert type(out) is collections.OrderedDict and out._metadata == {"": {"version": 1}}
    assert all(t.device == torch.device("nntile", 0) for t in out.values())
    assert out["w"] is out["tied"]  # one saved tensor loads as one tensor
    assert out["b"].dtype == torch.int64 and out["empty"].shape == (0, 2)
    torch.testing.assert_close(out["w"].cpu(), w, rtol=0, atol=0)
    torch.testing.assert_close(out["b"].cpu(), torch.arange(5), rtol=0, atol=0)
    assert isinstance(loaded["p"], torch.nn.Parameter) and loaded["p"].requires_grad and loaded["p"].is_leaf
    assert loaded["p"].device.type == "nntile" and loaded["n"] == 3


def test_load_into_a_module_on_nntile():
    src = torch.nn.Linear(3, 2)
    model = torch.nn.Linear(3, 2).to("nntile")
    model.load_state_dict(torch.load(_saved(src.state_dict()), map_location="nntile"))
    x = torch.randn(4, 3)
    torch.testing.assert_close(model(x.to("nntile")).cpu(), src(x), rtol=1e-5, atol=1e-6)


def test_load_elsewhere_is_untouched():
    x = torch.randn(3)
    assert torch.load(_saved(x)).device.type == "cpu"
    assert torch.load(_saved(x), map_location="cpu").device.type == "cpu"
    assert torch.load(_saved(x), map_location={"cuda:0": "nntile"}).device.type == "cpu"  # cpu storages stay
    assert torch.load(_saved(x), map_location=lambda s, loc: s).device.type == "cpu"
    saved_on_nntile = torch.load(_saved(x.to("nntile")))  # nntile tensors come back on nntile
    assert saved_on_nntile.device.type == "nntile"
    torch.testing.assert_close(saved_on_nntile.cpu(), x, rtol=0, atol=0)


def test_rng_state_save_and_restore():
    state = torch.nntile.get_rng_state()
    a = torch.randn(3, device="nntile").cpu()
    torch.nntile.set_rng_state(state)
    torch.testing.assert_close(torch.randn(3, device="nntile").cpu(), a, rtol=0, atol=0)
    torch.manual_seed(1)
    with torch.random.fork_rng(device_type="nntile"):
        torch.randn(100, device="nntile")
    b = torch.randn(3, device="nntile").cpu()
    torch.manual_seed(1)
    torch.testing.assert_close(torch.randn(3, device="nntile").cpu(), b, rtol=0, atol=0)


def test_checkpoint_recomputes_with_the_same_draws():
    lin = torch.nn.Linear(8, 8).to("nntile")
    x = torch.randn(4, 8, device="nntile", requires_grad=True)

    def block(t):
        return torch.nn.functional.dropout(lin(t), 0.5, training=True).sum()

    torch.manual_seed(0)
    ref = block(x)
    ref.backward()
    g = x.grad.cpu()
    x.grad = None
    torch.manual_seed(0)
    out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    out.backward()
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.cpu(), g, rtol=1e-6, atol=1e-6)


def test_autocast_without_a_lower_precision_says_so():
    with pytest.warns(UserWarning, match="nntile Autocast only supports dtypes of"):
        with torch.autocast("nntile", dtype=torch.bfloat16):
            y = torch.ones(2, 2, device="nntile") @ torch.ones(2, 2, device="nntile")
    assert y.dtype == torch.float32


# -- torch.nntile as torch.cuda: memory, synchronize, seeds, device name -------------

_FLOAT = 4  # bytes of a float32


def _settled() -> None:
    """Every value that died is released: its tiles' handles went back (a dead value's
    tiles are released once its last tasks ran)."""
    gc.collect()
    torch.nntile.synchronize()


def test_memory_allocated_counts_live_tiles():
    m = torch.nntile
    _settled()
    base = m.memory_allocated()
    xs = [torch.randn(128, 64).to("nntile") for _ in range(3)]
    m.synchronize()
    grown, reserved = m.memory_allocated(), m.memory_reserved()
    nbytes = 3 * 128 * 64 * _FLOAT
    assert grown - base >= nbytes
    assert reserved >= grown
    assert reserved == torch_nntile.info()["tile_bytes"]
    del xs
    _settled()
    assert m.memory_allocated() <= grown - nbytes
    assert m.memory_reserved() == reserved  # the dead tiles' handles are kept as spares
    m.empty_cache()
    m.synchronize()
    assert m.memory_reserved() == m.memory_allocated() == torch_nntile.info()["tile_bytes"]


def test_peaks_and_their_reset():
    m = torch.nntile
    _settled()
    m.reset_peak_memory_stats()
    a0, r0 = m.memory_allocated(), m.memory_reserved()
    assert (m.max_memory_allocated(), m.max_memory_reserved()) == (a0, r0)
    x = torch.randn(256, 256).to("nntile")
    y = x * 2
    m.synchronize()
    peak = m.max_memory_allocated()
    assert peak >= a0 + 2 * 256 * 256 * _FLOAT
    assert m.max_memory_reserved() >= m.memory_reserved() >= m.memory_allocated()
    del x, y
    _settled()
    assert m.memory_allocated() <= peak - 2 * 256 * 256 * _FLOAT
    assert m.max_memory_allocated() == peak  # a peak stays until reset
    m.reset_peak_memory_stats("nntile:0")
    assert m.max_memory_allocated() == m.memory_allocated() < peak
    assert m.max_memory_reserved() == m.memory_reserved()


def test_memory_stats_and_summary_agree_with_the_functions():
    m = torch.nntile
    x = torch.randn(100, 50).to("nntile")
    m.synchronize()
    s = m.memory_stats()
    assert s["allocated_bytes.all.current"] == m.memory_allocated() >= 100 * 50 * _FLOAT
    assert s["reserved_bytes.all.current"] == m.memory_reserved()
    assert s["allocated_bytes.all.peak"] == m.max_memory_allocated() >= s["allocated_bytes.all.current"]
    assert s["reserved_bytes.all.peak"] == m.max_memory_reserved() >= s["reserved_bytes.all.current"]
    assert s["num_alloc_retries"] >= 0 and s["num_ooms"] >= 0
    assert m.memory_stats(0) == m.memory_stats(torch.device("nntile")) == s
    text = m.memory_summary()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current"):
        assert f"{s[key]} B" in text
    assert "spare" in text and "spare" not in m.memory_summary(abbreviated=True)
    for wrong in ("cpu", 1, "nntile:1"):
        with pytest.raises(ValueError, match="Expected the nntile device"):
            m.memory_allocated(wrong)
    del x


def test_synchronize_runs_what_is_pending():
    x = torch.ones(4, device="nntile") + 1
    assert torch_nntile.has_pending_graph()
    torch.nntile.synchronize()
    assert not torch_nntile.has_pending_graph()
    rt = SESSION_STATE.live_runtime()
    assert rt.tasks_done() == rt.tasks_submitted  # everything submitted ran
    compiles = torch_nntile.info()["phases"]["compile"]["calls"]
    torch.testing.assert_close(x.cpu(), torch.full((4,), 2.0), rtol=0, atol=0)
    assert torch_nntile.info()["phases"]["compile"]["calls"] == compiles  # the read-back compiled nothing


def test_manual_seed_seeds_the_draws_of_nntile():
    torch.nntile.manual_seed(0)
    a = torch.randn(3, device="nntile").cpu()
    torch.manual_seed(0)
    torch.testing.assert_close(a, torch.randn(3), rtol=0, atol=0)
    torch.nntile.manual_seed_all(5)
    assert torch.nntile.initial_seed() == torch.initial_seed() == 5
    b = torch.randn(3, device="nntile").cpu()
    torch.manual_seed(5)
    torch.testing.assert_close(b, torch.randn(3), rtol=0, atol=0)
    torch.nntile.seed()
    assert torch.nntile.initial_seed() == torch.initial_seed()


def test_device_name_and_properties_read_the_runtime():
    rt = SESSION_STATE.live_runtime()
    assert torch.nntile.is_initialized()
    name = torch.nntile.get_device_name()
    assert name.startswith("nntile (StarPU, ") and f"{rt.ncpu} CPU worker" in name
    assert name.endswith(f"scheduler {rt.scheduler})")
    p = torch.nntile.get_device_properties(0)
    assert (p.name, p.cpu_workers, p.cuda_workers, p.scheduler) == (name, rt.ncpu, rt.ncuda, rt.scheduler)
    assert p.cpu_workers == 2 and p.cuda_workers == torch_nntile.cuda_worker_count()
    assert p.total_memory == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # in memory: the RAM


def test_queries_start_no_context():
    r = run_python("""
        import torch, torch_nntile
        m = torch.nntile
        assert not m.is_initialized()
        assert m.memory_allocated() == m.memory_reserved() == m.max_memory_allocated() == 0
        assert set(m.memory_stats().values()) == {0}
        m.synchronize(); m.empty_cache(); m.reset_peak_memory_stats(); m.memory_summary()
        p = m.get_device_properties()
        assert m.get_device_name() == p.name == "nntile" and (p.cpu_workers, p.scheduler) == (0, None)
        assert p.total_memory > 0
        assert not m.is_initialized()
        x = torch.ones(3, device="nntile") * 2  # recorded work: synchronize starts a context to run it
        m.synchronize()
        assert m.is_initialized() and not torch_nntile.has_pending_graph()
        assert m.memory_allocated() >= 12 and m.max_memory_allocated() >= 12
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_accelerator_routes_through_the_module():
    assert torch.get_device_module("nntile") is torch.nntile
    assert torch.accelerator.current_device_index() == 0
    assert torch.nntile.current_device() == 0
