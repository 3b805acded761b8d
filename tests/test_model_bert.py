"""torch_nntile.nn.model.bert (and its HF loader) against HF's BertForMaskedLM."""

from __future__ import annotations

import pytest
import torch
from conftest import rel_err
from hf_parity import RTOL
from mlm_parity import (
    BATCH,
    SEQ,
    VOCAB,
    MlmFamily,
    check_mlm,
    check_round_trip,
    check_rows_without_keys,
    hf_mlm,
    mlm_inputs,
    ours_from_hf,
)

from torch_nntile.nn.model.bert import BertConfig, BertIntermediate, BertMlm, BertModel
from torch_nntile.nn.model.bert_hf_loader import (
    bert_config_from_hf,
    bert_mlm_to_hf,
    export_bert_mlm_to_hf_state_dict,
    load_hf_into_bert_mlm,
)

transformers = pytest.importorskip("transformers")

BERT = MlmFamily(transformers.BertForMaskedLM, transformers.BertConfig, BertMlm, bert_config_from_hf,
                 load_hf_into_bert_mlm, bert_mlm_to_hf, export_bert_mlm_to_hf_state_dict, pad=0,
                 bias_alias="cls.predictions.bias", decoder="cls.predictions.decoder.",
                 defaults={"max_position_embeddings": 24})


def _hf(**kw) -> torch.nn.Module:
    return hf_mlm(BERT, **kw)


def _inputs():
    ids, token_types, _ = mlm_inputs(BERT.pad)
    return ids, token_types, (ids != BERT.pad).long()


@pytest.mark.parametrize("device", ["cpu", "nntile"])
@pytest.mark.parametrize("masked", [False, True])
def test_bert_mlm_matches_hf(device, masked):
    check_mlm(BERT, _hf(), device, masked=masked)


@pytest.mark.parametrize("masked", [False, True])
def test_bert_mlm_matches_hf_tiled(masked):
    check_mlm(BERT, _hf(hidden_act="gelu_new"), "nntile", masked=masked, tiles={"batch": [1, 2], "seq": [5, 6]})


def test_bert_mlm_untied_relu_matches_hf():
    check_mlm(BERT, _hf(tie_word_embeddings=False, hidden_act="relu"), "nntile", tiles={"batch": [2, 1]})


@pytest.mark.parametrize("device", ["cpu", "nntile"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_bert_rows_without_keys_match_hf(device, is_causal):
    check_rows_without_keys(BERT, device, is_causal)


def test_bert_hidden_states_and_self_attention_layout():
    hf = _hf()
    ours = ours_from_hf(BERT, hf)
    ids, token_types, mask = _inputs()
    want = hf.bert(input_ids=ids, token_type_ids=token_types, attention_mask=mask).last_hidden_state
    assert rel_err(ours.bert(ids, token_types, attention_mask=mask), want) <= RTOL
    # a bool attn_mask [batch, 1, 1, seq] is the padding mask by another name
    assert rel_err(ours.bert(ids, token_types, None, mask.bool()[:, None, None, :]), want) <= RTOL
    attn = ours.bert.encoder.layer[0].attention.self
    x = torch.randn(BATCH, SEQ, 32)
    heads = attn(x)  # the reference's layout: [n_heads, batch, seq, head_size]
    assert heads.shape == (4, BATCH, SEQ, 8)
    hf_attn = hf.bert.encoder.layer[0].attention.self
    assert rel_err(heads.permute(1, 2, 0, 3).reshape(BATCH, SEQ, 32), hf_attn(x)[0]) <= RTOL


@pytest.mark.parametrize("tied", [True, False])
def test_bert_state_dict_round_trip(tied):
    check_round_trip(BERT, tied)


def test_bert_builds_from_any_config():
    hf = _hf()
    for config in (hf.config, bert_config_from_hf(hf.config)):
        model = BertModel(config)
        assert model.embeddings.word_embeddings.weight.shape == (VOCAB, 32)
        assert model.encoder.layer[1].attention.self.query.weight.shape == (32, 8, 4)
        assert model.encoder.layer[1].attention.self.query.bias.shape == (4, 8)
        assert model.encoder.layer[1].attention.output.dense.weight.shape == (8, 4, 32)
    assert BertMlm(BertConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                              num_attention_heads=2)).tied


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu", "silu"])
def test_bert_intermediate_activations(act):
    config = transformers.BertConfig(hidden_size=16, intermediate_size=24, num_attention_heads=2, hidden_act=act)
    hf = transformers.models.bert.modeling_bert.BertIntermediate(config)
    ours = BertIntermediate(config)
    with torch.no_grad():
        ours.dense.weight.copy_(hf.dense.weight)
        ours.dense.bias.copy_(hf.dense.bias)
    x = torch.randn(2, 5, 16)
    assert rel_err(ours.to("nntile")(x.to("nntile")).cpu(), hf(x)) <= RTOL


def test_bert_errors():
    with pytest.raises(ValueError, match="hidden_size 30 is not a multiple of num_attention_heads 4"):
        BertMlm(BertConfig(hidden_size=30, num_attention_heads=4))
    with pytest.raises(ValueError, match="hidden_size 65"):
        BertConfig(hidden_size=65, num_attention_heads=4).validate()
    with pytest.raises(ValueError, match="unsupported hidden_act 'quick_gelu'"):
        BertIntermediate(BertConfig(hidden_act="quick_gelu"))
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        BertModel(transformers.BertConfig(hidden_size=16, num_attention_heads=2, position_embedding_type="relative_key"))
    small = BertModel(BertConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=6))
    with pytest.raises(ValueError, match="longer than max_position_embeddings 6"):
        small(torch.zeros(1, 7, dtype=torch.long))
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="either attention_mask"):
        small(ids, attn_mask=torch.ones(4, 4, dtype=torch.bool), attention_mask=torch.ones(1, 4))
    hf = _hf()
    ours = ours_from_hf(BERT, hf)
    sd = hf.state_dict()
    del sd["bert.encoder.layer.1.output.dense.weight"]
    with pytest.raises(ValueError, match="lacks 1 weights, e.g. bert.encoder.layer.1.output.dense.weight"):
        load_hf_into_bert_mlm(ours, sd)
    with pytest.raises(ValueError, match="expected"):
        load_hf_into_bert_mlm(BertMlm(bert_config_from_hf(_hf(intermediate_size=40).config)), hf)
    with pytest.raises(ValueError, match="does not match"):
        export_bert_mlm_to_hf_state_dict(ours, config=_hf(num_hidden_layers=1).config)


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_bert_is_causal_matches_hf_decoder(device):
    check_mlm(BERT, _hf(is_decoder=True), device, is_causal=True)  # HF's BERT as a decoder: causal and padding masks
