"""More stock HuggingFace families train on nntile with no host fallback and give CPU's numbers.

ResNet (train mode, so batch norm updates its running statistics), ViT, Whisper (with
labels), Mixtral (the default experts implementation, top-k routing), BLOOM, DeBERTa-v2
(relative attention) and Mamba, each built twice from a tiny config with the same seed,
one copy moved to nntile, ``cpu_fallback=False`` and no op run on the host
(``fallback_counts() == {}``). Each runs untiled and with the batch cut into 2 tiles:
dim 0 of every input named ``batch``, and of the token embedding's output (see
``name_batch``), so that the hidden states are tiled as well, not only the loss.
Compared with CPU fp32:

* the loss of the first step within 1e-5 relative, and every parameter's gradient
  within 1e-4 relative to its norm (or, for a gradient that is zero in exact arithmetic,
  to 1e-6 of the norm of all gradients: see ``assert_grads_close``);
* the loss of each of 3 ``torch.optim.AdamW`` steps within 1e-5;
* after those steps, the parameters within 1e-4 relative, and the buffers (batch norm's
  running mean and variance within 1e-4, its step count exactly).

The parameters compared after the steps leave out those whose CPU gradient at the first
step is rounding noise: below 1e-8 of the norm of all gradients. In ViT these are the
attention key biases, in DeBERTa the position-key biases: a bias added to every key of a
row adds the same constant to each of that row's scores, which softmax ignores, so the
exact gradient is zero and CPU's fp32 one is noise of 1e-11 to 1e-13 relative. AdamW
scales each update by the gradient's own running size, so the noise sets those updates,
and as these biases start at zero the updates are all they hold: no two fp32 runs agree
on them (CPU's fp32 run is nowhere near an fp64 one there either). The test checks that the
parameters left out are exactly those biases, so that nothing else slips out unseen;
every gradient, those included, is still compared at the first step.
"""

from __future__ import annotations

import pytest
import torch
import transformers as hf
from conftest import rel_err
from test_hf_models import assert_grads_close, assert_loss_close

import torch_nntile
from torch_nntile.backend.device import read
from torch_nntile.graph import axes

hf.logging.set_verbosity_error()

B, S, V = 4, 16, 128  # batch, sequence, vocabulary
LOSS_RTOL, STEP_RTOL = 1e-5, 1e-4
STEPS = 3
NOISE = 1e-8  # a gradient below this fraction of the norm of all gradients is rounding noise
# Parameters whose gradient is zero in exact arithmetic (see the docstring), by suffix.
ZERO_GRAD = {"vit": "attention.k_proj.bias", "deberta": "attention.self.pos_key_proj.bias"}
MODELS = ["resnet", "vit", "whisper", "mixtral", "bloom", "deberta", "mamba"]


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """A freshly initialised tiny ``name`` model in train mode, dropout off."""
    if name == "resnet":
        cfg = hf.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                              layer_type="basic", num_labels=3)
        cls = hf.ResNetForImageClassification
    elif name == "vit":
        cfg = hf.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3)
        cls = hf.ViTForImageClassification
    elif name == "whisper":
        cfg = hf.WhisperConfig(vocab_size=V, num_mel_bins=16, encoder_layers=1, decoder_layers=1, d_model=32,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                               decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32, dropout=0.0,
                               attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
                               decoder_layerdrop=0.0, pad_token_id=1, bos_token_id=2, eos_token_id=2,
                               decoder_start_token_id=2, begin_suppress_tokens=None, suppress_tokens=None)
        cls = hf.WhisperForConditionalGeneration
    elif name == "mixtral":  # default experts implementation; 2 of 4 experts per token
        cfg = hf.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                               num_experts_per_tok=2, max_position_embeddings=S, attention_dropout=0.0,
                               router_jitter_noise=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        cls = hf.MixtralForCausalLM
    elif name == "bloom":
        cfg = hf.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0,
                             attention_dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        cls = hf.BloomForCausalLM
    elif name == "deberta":
        cfg = hf.DebertaV2Config(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=S, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0, pooler_dropout=0.0, cls_dropout=0.0,
                                 relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                                 max_relative_positions=S, num_labels=3, pad_token_id=0)
        cls = hf.DebertaV2ForSequenceClassification
    elif name == "mamba":
        cfg = hf.MambaConfig(vocab_size=V, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                             conv_kernel=4, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        cls = hf.MambaForCausalLM
    else:
        raise ValueError(name)
    torch.manual_seed(seed)
    return cls(cfg).train()


def inputs(name: str, seed: int = 1) -> dict[str, torch.Tensor]:
    """CPU inputs with ``labels``, batch ``B`` in dim 0 of each."""
    g = torch.Generator().manual_seed(seed)
    if name in ("resnet", "vit"):
        px = 32 if name == "resnet" else 16
        return {"pixel_values": torch.randn(B, 3, px, px, generator=g), "labels": torch.randint(0, 3, (B,), generator=g)}
    if name == "whisper":  # 16 mel bins by 2 * max_source_positions frames; 8 target tokens
        return {"input_features": torch.randn(B, 16, 32, generator=g), "labels": torch.randint(3, V, (B, 8), generator=g)}
    ids = torch.randint(3, V - 1, (B, S), generator=g)
    if name == "deberta":
        return {"input_ids": ids, "labels": torch.randint(0, 3, (B,), generator=g)}
    return {"input_ids": ids, "labels": ids.clone()}


def name_batch(model: torch.nn.Module, dev_in: dict[str, torch.Tensor]) -> None:
    """Name dim 0 of every input "batch", and of the token embedding's output: it gathers
    rows by the flattened ids, so the name on the ids would not reach the hidden states
    (as in test_hf_tiling)."""
    for v in dev_in.values():
        torch_nntile.set_axis_group_name(v, {0: "batch"})
    if "pixel_values" not in dev_in:  # token models, Whisper's decoder included
        model.get_input_embeddings().register_forward_hook(
            lambda mod, args, out: torch_nntile.set_axis_group_name(out, {0: "batch"}))


def assert_state_close(model: torch.nn.Module, ref: torch.nn.Module, skip: set[str], rtol: float = STEP_RTOL) -> None:
    """Parameters and buffers of ``model`` (on nntile) as ``ref``'s (CPU), but for ``skip``."""
    want = ref.state_dict()
    for name, v in model.state_dict().items():
        if name in skip:
            continue
        got, w = v.detach().cpu(), want[name]
        assert got.dtype == w.dtype and got.shape == w.shape, name
        if w.is_floating_point():
            err = rel_err(got, w)
            assert err <= rtol, f"{name} after {STEPS} AdamW steps: relative error {err:.3g} > {rtol}"
        else:
            assert torch.equal(got, w), f"{name}: {got} vs CPU {w}"


@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "batch-tiled"])
@pytest.mark.parametrize("name", MODELS)
def test_adamw_training_matches_cpu(name, tiled):
    torch_nntile.init_context(ncpu=2, cpu_fallback=False)
    torch_nntile.reset_info()
    ref = build(name)
    model = build(name)
    model.load_state_dict(ref.state_dict())
    model = model.to("nntile")
    cpu_in = inputs(name)
    dev_in = {k: v.to("nntile") for k, v in cpu_in.items()}
    if tiled:
        name_batch(model, dev_in)
        torch_nntile.set_axis_group_tiling("batch", B // 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    for step in range(STEPS):
        out = model(**dev_in)
        if tiled and step == 0:  # the batch tiling reached the model's output
            assert axes.tiling_of(read(out.logits).axes[0].root()) == (B // 2, B // 2)
        got = out.loss
        want = ref(**cpu_in).loss
        assert_loss_close(got, want, LOSS_RTOL)  # first step: 1e-5; later ones: the same held
        got.backward()
        want.backward()
        if step == 0:
            assert_grads_close(model, ref)
            grads = {n: p.grad.norm().item() for n, p in ref.named_parameters() if p.grad is not None}
            total = torch.tensor(list(grads.values())).norm().item()
            noise = {n for n, g in grads.items() if g <= NOISE * total}
            suffix = ZERO_GRAD.get(name)
            assert noise == {n for n in grads if suffix and n.endswith(suffix)}, sorted(noise)
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad(set_to_none=True)
    assert_state_close(model, ref, skip=noise)
    assert torch_nntile.fallback_counts() == {}
