"""Tiled transformers: the axis groups a user names on a stock HuggingFace model, and
CPU's loss and gradients under tilings of the sequence (even and uneven), hidden and
vocabulary groups.

The names come from the model's inputs and weights: ``batch`` and ``seq`` from dims 0
and 1 of ``input_ids``, ``vocab`` and ``hidden`` from dims 0 and 1 of the input
embedding's weight (and of the output embedding's, when it is not tied). The embedding
gathers rows by the *flattened* ids: the gathered rows share the flattened ids' group,
whose tiling derives from ``batch``'s, so a batch tiling of the ids reaches the hidden
states; ``seq`` (an inner dim of the flattening) does not, so a forward hook on the
embedding names dims 0 and 1 of its output as well.
"""

from __future__ import annotations

import pytest
import torch
from test_hf_models import (
    FALLBACK,
    assert_grads_close,
    assert_loss_close,
    batch,
    on_nntile,
    pair,
    to_nntile,
)

import torch_nntile
from torch_nntile.backend.device import read


def name_axes(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.utils.hooks.RemovableHandle:
    """Name the batch, seq, hidden and vocab axis groups of a causal LM on nntile."""
    torch_nntile.set_axis_group_name(input_ids, {0: "batch", 1: "seq"})
    emb = model.get_input_embeddings()
    torch_nntile.set_axis_group_name(emb.weight, {0: "vocab", 1: "hidden"})
    head = model.get_output_embeddings()
    if head is not None and head.weight is not emb.weight:
        torch_nntile.set_axis_group_name(head.weight, {0: "vocab", 1: "hidden"})
    return emb.register_forward_hook(lambda mod, args, out: torch_nntile.set_axis_group_name(out, {0: "batch", 1: "seq"}))


def _check_tiled(family: str, tilings: dict, cpu_fallback: bool, record_property) -> None:
    ref, model = pair(family)
    inputs = batch(family, padded=True)
    dev = to_nntile(inputs)
    hook = name_axes(model, dev["input_ids"])
    for name, t in tilings.items():
        torch_nntile.set_axis_group_tiling(name, t)
    with on_nntile(cpu_fallback, record_property):
        got = model(**dev)
        want = ref(**inputs)
        assert_loss_close(got.loss, want.loss)
        got.loss.backward()
        want.loss.backward()
        assert_grads_close(model, ref)
        assert read(got.logits).axes[2].root().names()[:1] == ("vocab",)
    hook.remove()
    record_property("retiles", torch_nntile.metrics().get("retiles"))


TILINGS = {
    "seq16": {"seq": 16},
    "seq-uneven": {"seq": [8, 24, 32]},
    "hidden64": {"hidden": 64},
    "vocab256": {"vocab": 256},
    "batch2": {"batch": 2},
}
ALL = {"seq": 16, "hidden": 64, "vocab": 256}


@FALLBACK
def test_gpt2_tiled_seq_hidden_vocab(cpu_fallback, record_property):
    """The issue's GPT-2 with the sequence by 16, hidden by 64, vocabulary by 256."""
    _check_tiled("gpt2-eager", ALL, cpu_fallback, record_property)


@pytest.mark.slow
@FALLBACK
@pytest.mark.parametrize("tiling", list(TILINGS), ids=list(TILINGS))
@pytest.mark.parametrize("family", ["gpt2-eager", "gpt2-sdpa", "llama"])
def test_tiled_matches_cpu(family, tiling, cpu_fallback, record_property):
    _check_tiled(family, TILINGS[tiling], cpu_fallback, record_property)


@pytest.mark.slow
@FALLBACK
def test_llama_tiled_seq_hidden_vocab(cpu_fallback, record_property):
    _check_tiled("llama", {"seq": [8, 24, 32], "hidden": 64, "vocab": 256}, cpu_fallback, record_property)


def _batch_tiled_step(ref, model, inputs: dict, dev: dict) -> dict:
    """A step with ``batch`` tiled by 2 (named by the caller): CPU's loss and gradients;
    returns the step's metrics, read once every task is done."""
    torch_nntile.set_axis_group_tiling("batch", 2)
    torch_nntile.wait()
    torch_nntile.reset_info()
    got, want = model(**dev), ref(**inputs)
    assert_loss_close(got.loss, want.loss)
    got.loss.backward()
    want.loss.backward()
    assert_grads_close(model, ref)
    torch_nntile.wait()
    return torch_nntile.metrics()


def test_gpt2_batch_tiling_reaches_the_attention():
    """The batch tiling survives GPT-2's reshapes back and forth and its qkv ``split``:
    only the embedding's gather of the flattened ids and two reshapes next to it re-tile
    (before: 16 reshape and 6 strided-view re-tilings), and the loss and gradients are CPU's."""
    ref, model = pair("gpt2-eager")
    inputs = batch("gpt2-eager")
    dev = to_nntile(inputs)
    hook = name_axes(model, dev["input_ids"])
    retiles = _batch_tiled_step(ref, model, inputs, dev)["retiles"]
    hook.remove()
    assert set(retiles) <= {"index_select", "reshape"}, retiles
    assert sum(retiles.get("reshape", {}).values()) <= 2, retiles
    assert "'batch' (extent 8)" not in retiles.get("reshape", {}), retiles


def test_gpt2_batch_tiling_of_the_ids_alone_reaches_the_hidden_states():
    """No hook: naming the ids' dims and tiling ``batch`` tiles the embedding's output and
    every layer after it (softmax: a task per batch tile and layer); only the labels
    (not named) are re-tiled for the loss; CPU's loss and gradients."""
    ref, model = pair("gpt2-eager")
    inputs = batch("gpt2-eager")
    dev = to_nntile(inputs)
    torch_nntile.set_axis_group_name(dev["input_ids"], {0: "batch", 1: "seq"})
    m = _batch_tiled_step(ref, model, inputs, dev)
    assert m["kernels"]["_softmax"]["tasks"] == 4 * 2, m["kernels"]
    assert m["kernels"]["index_select"]["tasks"] >= 4, m["kernels"]
    assert set(m["retiles"]) <= {"reshape"} and sum(m["retiles"].get("reshape", {}).values()) <= 1, m["retiles"]
