"""Checkpoints of models on nntile: storage addresses, safetensors, save_pretrained /
from_pretrained round trips.

HuggingFace and safetensors tell shared storages apart by
``tensor.untyped_storage().data_ptr()`` (with the device and the storage's nbytes) and
tensors within one storage by ``data_ptr()`` ranges; each nntile storage has an address
of its own, so only truly tied weights (GPT-2's ``wte`` / ``lm_head``) count as shared.
"""

from __future__ import annotations

import copy
import filecmp
import json
import os

import pytest
import safetensors.torch
import torch
from test_hf_models import FALLBACK, batch, build, on_nntile, pair, to_nntile

import torch_nntile


def _span(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def test_each_storage_has_its_own_address():
    xs = [torch.randn(5, 7).to("nntile"), torch.zeros(3, device="nntile"), torch.ones(300, 400, device="nntile"),
          torch.arange(10, device="nntile")]
    xs += [xs[0] + 1, xs[2].sum(0), torch.empty(2, 2, dtype=torch.float64, device="nntile")]
    spans = sorted(_span(x) for x in xs)
    assert all(p != 0 for p, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))  # live storages never overlap
    assert all(x.untyped_storage().nbytes() == x.numel() * x.element_size() for x in xs)  # as on CPU


def test_views_share_their_base_address_with_offsets():
    x = torch.randn(6, 8).to("nntile")
    p, item = x.data_ptr(), x.element_size()
    assert x.untyped_storage().data_ptr() == p
    for v, offset in [(x[2], 16), (x[:, 3], 3), (x.t(), 0), (x.view(-1)[-1], 47), (x.detach(), 0), (x[1:4, 2:], 10),
                      (x.view(2, 3, 8)[1], 24)]:
        assert v.untyped_storage().data_ptr() == p
        assert v.data_ptr() == p + offset * item
    assert x.clone().data_ptr() != p
    with torch.no_grad():
        x.add_(1)  # in place: same storage, same address
    assert x.data_ptr() == p
    assert torch.empty(0, device="nntile").data_ptr() == 0  # as on CPU: an empty tensor points nowhere


def test_a_grown_storage_moves_and_its_views_follow():
    from torch_nntile.backend import device

    x = torch.arange(6.0, device="nntile")
    v = x[2:]
    before = x.data_ptr()
    x.resize_(20)
    assert x.untyped_storage().nbytes() == 80
    if device._SWAP or device.NATIVE:
        assert x.data_ptr() != before and v.data_ptr() == x.data_ptr() + 2 * 4
    else:  # torch 2.11 without the C++ library: x alone moves (device._grow), its views read the same value
        assert x.data_ptr() != before and v.data_ptr() == before + 2 * 4
        v.add_(1)
        assert torch.equal(x[2:6].cpu(), torch.arange(3.0, 7.0))
        v.sub_(1)
    assert torch.equal(x[:6].cpu(), torch.arange(6.0))


def test_safetensors_sees_distinct_and_shared_storages():
    a, b = torch.randn(4, 3), torch.randn(3)
    an, bn = a.to("nntile"), b.to("nntile")
    assert safetensors.torch.save({"a": an, "b": bn}) == safetensors.torch.save({"a": a, "b": b})
    with pytest.raises(RuntimeError, match="share memory"):  # as for CPU tensors sharing a storage
        safetensors.torch.save({"a": an, "a2": an})
    with pytest.raises(RuntimeError, match="share memory"):
        safetensors.torch.save({"a": a, "a2": a})


SAVED = ["gpt2-eager", "llama", "bart"]  # tied embeddings, untied, and a tie of four weights


def _tied(model: torch.nn.Module) -> list[set[str]]:
    """Names of parameters that are one tensor."""
    groups: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), set()).add(name)
    return sorted((g for g in groups.values() if len(g) > 1), key=sorted)


def _assert_same_checkpoint(a: str, b: str) -> None:
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for n in names:
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), n


@pytest.mark.parametrize("family", SAVED)
def test_save_pretrained_writes_cpus_files(family, tmp_path):
    """Natively: the same files as the model saved on CPU; tied weights stored once."""
    torch_nntile.reset_info()
    ref, model = pair(family, "small")
    assert _tied(model) == _tied(ref)
    ref.save_pretrained(tmp_path / "cpu")
    model.save_pretrained(tmp_path / "nntile")
    _assert_same_checkpoint(tmp_path / "cpu", tmp_path / "nntile")
    if family == "gpt2-eager":
        stored = safetensors.torch.load_file(tmp_path / "nntile" / "model.safetensors")
        assert "transformer.wte.weight" in stored and "lm_head.weight" not in stored
    assert not torch_nntile.fallback_counts()


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in model.state_dict().items()}


@FALLBACK
@pytest.mark.parametrize("family", SAVED)
def test_trained_checkpoint_round_trip(family, cpu_fallback, record_property, tmp_path):
    """A model trained on nntile saves what CPU would save of its weights; loaded back
    and moved to nntile it has exactly those weights, its ties, and trains on as the
    same checkpoint does on CPU."""
    _, model = pair(family, "small")
    inputs = batch(family, "small")
    dev_inputs = to_nntile(inputs)
    with on_nntile(cpu_fallback, record_property):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            model(**dev_inputs).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        model.save_pretrained(tmp_path / "nntile")
        trained = _state(model)
        on_cpu = build(family, "small", seed=1)
        on_cpu.load_state_dict(trained)
        on_cpu.save_pretrained(tmp_path / "cpu")
        _assert_same_checkpoint(tmp_path / "cpu", tmp_path / "nntile")

        cls = type(model)
        resumed = cls.from_pretrained(tmp_path / "nntile").to("nntile")
        ref = cls.from_pretrained(tmp_path / "nntile")
        assert _tied(resumed) == _tied(model)
        got = _state(resumed)
        assert got.keys() == trained.keys()
        for k, v in trained.items():
            assert torch.equal(got[k], v), k
        assert json.loads((tmp_path / "nntile" / "config.json").read_text())["architectures"] == [cls.__name__]

        losses = []
        for m, x in ((resumed, dev_inputs), (ref, inputs)):
            o = torch.optim.AdamW(m.parameters(), lr=1e-2)
            out = [m(**x).loss]
            out[0].backward()
            o.step()
            losses.append((out[0].item(), m(**x).loss.item()))
        (g0, g1), (w0, w1) = losses
        assert abs(g0 - w0) <= 1e-5 * abs(w0) and abs(g1 - w1) <= 1e-4 * abs(w1), losses


def test_deepcopy_of_a_model_on_nntile():
    """``copy.deepcopy`` (EMA or reference copies of a model) copies the values, buffers
    included, into new storages."""
    _, model = pair("llama", "small")
    twin = copy.deepcopy(model)
    assert _tied(twin) == _tied(model)
    for (k, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        assert b.device.type == "nntile" and b.data_ptr() != a.data_ptr(), k
        assert torch.equal(a.cpu(), b.cpu()), k
    buf = next(model.buffers())
    assert copy.deepcopy({"a": buf, "b": buf})["a"] is not buf
