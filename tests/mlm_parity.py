"""What the BERT and RoBERTa tests share: both families run one model and one loader
code, so one set of checks against HF's masked LMs serves both. ``hf_parity`` gives the
bound, the tiling and the spread of HF's weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as TF
from conftest import rel_err
from hf_parity import BATCH_SEQ, RTOL, spread_norms_and_biases_, tile

VOCAB, BATCH, SEQ = 97, 3, 11


@dataclass(frozen=True)
class MlmFamily:
    """One masked-LM family under test: HF's classes, ours, and HF's names that differ."""

    hf_model: type  # HF's ...ForMaskedLM
    hf_config: type
    model: type  # ours
    config_from_hf: Callable[[Any], Any]
    load: Callable[[Any, Any], None]
    to_hf: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    export: Callable[..., dict[str, torch.Tensor]]
    pad: int
    bias_alias: str  # HF's second name of the decoder bias (unread when untied)
    decoder: str  # HF's decoder prefix
    defaults: dict[str, Any] = field(default_factory=dict)  # of the HF config


def hf_mlm(family: MlmFamily, **kw: Any) -> torch.nn.Module:
    """A seeded tiny HF model of ``family`` (eager attention, no dropout), its norms and
    biases drawn away from HF's ones and zeros so that they matter."""
    args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager",
                pad_token_id=family.pad)
    torch.manual_seed(0)
    model = family.hf_model(family.hf_config(**{**args, **family.defaults, **kw})).eval()
    for norm in ("LayerNorm", "layer_norm"):
        spread_norms_and_biases_(model, norm)
    return model


def mlm_inputs(pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded ids (right padding and a pad token inside a row), token types and labels."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    ids[0, -3:] = pad
    ids[1, 4] = pad
    ids[2, -1] = pad
    return ids, torch.randint(0, 2, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return TF.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def ours_from_hf(family: MlmFamily, hf: torch.nn.Module) -> torch.nn.Module:
    """Our model of ``hf``'s config with ``hf``'s weights, tied as ``hf`` is."""
    ours = family.model(family.config_from_hf(hf.config))
    family.load(ours, hf)
    assert ours.tied == hf.config.tie_word_embeddings
    return ours


def check_mlm(family: MlmFamily, hf: torch.nn.Module, device: str, *, masked: bool = True, tiles: dict | None = None,
              ids: torch.Tensor | None = None, is_causal: bool = False) -> float:
    """Our logits and every gradient (in HF's names) against HF's, within ``RTOL``;
    returns the largest relative error. ``ids`` replaces ``mlm_inputs``' ids; the
    padding mask (``masked``) is ``ids != pad``."""
    default_ids, token_types, labels = mlm_inputs(family.pad)
    ids = default_ids if ids is None else ids
    mask = (ids != family.pad).long() if masked else None
    want = hf(input_ids=ids, token_type_ids=token_types, attention_mask=mask).logits
    mlm_loss(want, labels).backward()
    ours = ours_from_hf(family, hf).to(device)
    ids_d, tt_d, labels_d = (t.to(device) for t in (ids, token_types, labels))
    tile(tiles, (ids_d, BATCH_SEQ))
    got = ours(ids_d, token_type_ids=tt_d, attention_mask=None if mask is None else mask.to(device), is_causal=is_causal)
    mlm_loss(got, labels_d).backward()
    errs = {"logits": rel_err(got.cpu(), want)}
    grads = family.to_hf({n: p.grad for n, p in ours.named_parameters()})
    for name, p in hf.named_parameters():
        if p.grad is None:  # untied, HF keeps a second output bias that its forward never reads
            assert name == family.bias_alias and not hf.config.tie_word_embeddings, name
        elif name.endswith("key.bias"):  # softmax ignores it: both gradients are rounding noise
            assert grads[name].abs().max() < 1e-6, name
        else:
            errs[name] = rel_err(grads[name], p.grad)
    worst = max(errs, key=errs.get)
    assert errs[worst] <= RTOL, (worst, errs[worst])
    return errs[worst]


def check_round_trip(family: MlmFamily, tied: bool) -> None:
    """HF -> ours -> HF gives HF's state dict back (every key, ``load_state_dict``
    strict), and a saved checkpoint without the tied copies loads tied again."""
    hf = hf_mlm(family, tie_word_embeddings=tied)
    ours = ours_from_hf(family, hf)
    back = family.export(ours, config=hf.config)
    want = hf.state_dict()
    assert set(back) == set(want)
    for k in want:
        theirs = family.decoder + "bias" if k == family.bias_alias and not tied else k  # HF's unread second bias
        assert torch.equal(back[k], want[theirs]), k
    fresh = hf_mlm(family, tie_word_embeddings=tied)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(back, strict=True)
    ids, token_types, _ = mlm_inputs(family.pad)
    mask = (ids != family.pad).long()
    assert torch.equal(fresh(input_ids=ids, attention_mask=mask).logits, hf(input_ids=ids, attention_mask=mask).logits)
    saved = {k: v.clone() for k, v in back.items() if not (tied and k.startswith(family.decoder))}
    again = family.model(family.config_from_hf(hf.config))
    again.tie_weights(not tied)
    family.load(again, saved)
    assert again.tied == tied
    assert torch.equal(again(ids, token_type_ids=token_types), ours(ids, token_type_ids=token_types))


def check_rows_without_keys(family: MlmFamily, device: str, is_causal: bool) -> float:
    """A row all padding and, causal (HF's decoder), left padding: queries that may see
    no key. HF's additive mask averages every value there; ours must too (a bool mask
    would give NaN or zeros)."""
    ids = mlm_inputs(family.pad)[0]
    ids[1] = family.pad
    ids[2, :3] = family.pad
    return check_mlm(family, hf_mlm(family, is_decoder=is_causal), device, ids=ids, is_causal=is_causal)
