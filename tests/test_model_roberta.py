"""torch_nntile.nn.model.roberta (and its HF loader) against HF's RobertaForMaskedLM."""

from __future__ import annotations

import pytest
import torch
from mlm_parity import MlmFamily, check_mlm, check_round_trip, check_rows_without_keys, hf_mlm, mlm_inputs, ours_from_hf

from torch_nntile.nn.model.roberta import RobertaConfig, RobertaMlm, RobertaModel, roberta_position_ids
from torch_nntile.nn.model.roberta_hf_loader import (
    export_roberta_mlm_to_hf_state_dict,
    load_hf_into_roberta_mlm,
    roberta_config_from_hf,
    roberta_mlm_to_hf,
)

transformers = pytest.importorskip("transformers")

PAD = 1
ROBERTA = MlmFamily(transformers.RobertaForMaskedLM, transformers.RobertaConfig, RobertaMlm, roberta_config_from_hf,
                    load_hf_into_roberta_mlm, roberta_mlm_to_hf, export_roberta_mlm_to_hf_state_dict, pad=PAD,
                    bias_alias="lm_head.bias", decoder="lm_head.decoder.",
                    defaults={"max_position_embeddings": 16, "type_vocab_size": 2, "hidden_act": "gelu_new"})


def _hf(**kw) -> torch.nn.Module:
    return hf_mlm(ROBERTA, **kw)


@pytest.mark.parametrize("device", ["cpu", "nntile"])
@pytest.mark.parametrize("masked", [False, True])
def test_roberta_mlm_matches_hf(device, masked):
    check_mlm(ROBERTA, _hf(), device, masked=masked)


@pytest.mark.parametrize("masked", [False, True])
def test_roberta_mlm_matches_hf_tiled(masked):
    check_mlm(ROBERTA, _hf(), "nntile", masked=masked, tiles={"batch": [2, 1], "seq": [4, 7]})


def test_roberta_mlm_untied_matches_hf():
    check_mlm(ROBERTA, _hf(tie_word_embeddings=False, hidden_act="gelu"), "nntile", tiles={"seq": [6, 5]})


@pytest.mark.parametrize("device", ["cpu", "nntile"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_roberta_rows_without_keys_match_hf(device, is_causal):
    check_rows_without_keys(ROBERTA, device, is_causal)


def test_roberta_positions_match_hf():
    ids, token_types, _ = mlm_inputs(PAD)
    want = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(ids, PAD)
    assert torch.equal(roberta_position_ids(ids, PAD), want)
    assert torch.equal(roberta_position_ids(ids.to("nntile"), PAD).cpu(), want)
    ours = ours_from_hf(ROBERTA, _hf())  # the reference's order: position_ids before token_type_ids
    assert torch.equal(ours(ids, want, token_types), ours(ids, token_type_ids=token_types))


@pytest.mark.parametrize("tied", [True, False])
def test_roberta_state_dict_round_trip(tied):
    check_round_trip(ROBERTA, tied)


def test_roberta_configs():
    hf = _hf()
    ours = roberta_config_from_hf(hf)
    assert (ours.pad_token_id, ours.type_vocab_size, ours.hidden_act, ours.head_dim) == (PAD, 2, "gelu_new", 8)
    bert = ours.to_bert_config()
    assert (bert.hidden_size, bert.layer_norm_eps, bert.name) == (32, ours.layer_norm_eps, "bert")
    default = RobertaConfig()
    assert (default.vocab_size, default.pad_token_id, default.max_position_embeddings) == (50265, 1, 514)
    model = RobertaModel(hf.config)  # HF's config builds it too
    assert model.embeddings.position_embeddings.weight.shape == (16, 32)
    assert model.embeddings.position_embeddings.weight[PAD].abs().max() == 0  # HF zeroes the padding rows
    assert model.embeddings.word_embeddings.weight[PAD].abs().max() == 0


def test_roberta_errors():
    with pytest.raises(ValueError, match="hidden_size 65 is not a multiple of num_attention_heads 4"):
        RobertaConfig(hidden_size=65, num_attention_heads=4).validate()
    with pytest.raises(ValueError, match="hidden_size 30"):
        RobertaMlm(RobertaConfig(hidden_size=30, num_attention_heads=4))
    small = RobertaModel(RobertaConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                       num_attention_heads=2, max_position_embeddings=8))
    small(torch.full((1, 6), 3))  # positions 2..7
    with pytest.raises(ValueError, match="needs position 8, beyond max_position_embeddings 8"):
        small(torch.full((1, 7), 3))
    hf = _hf()
    sd = hf.state_dict()
    del sd["roberta.embeddings.position_embeddings.weight"]
    with pytest.raises(ValueError, match="lacks 1 weights, e.g. roberta.embeddings.position_embeddings.weight"):
        load_hf_into_roberta_mlm(RobertaMlm(roberta_config_from_hf(hf.config)), sd)
