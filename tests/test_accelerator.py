"""Importing torch_nntile makes nntile the process's accelerator; the ordinary CPU paths
that consult the current accelerator (pinning, loading, RNG state) keep working."""

from __future__ import annotations

import collections
import io

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_nntile  # noqa: F401


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
