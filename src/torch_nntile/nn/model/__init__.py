"""The model zoo: a module per family, each built from a config (HF's, ours or any
object with the same attribute names; importing needs no ``transformers``) and loaded
from the matching HF model by its ``*_hf_loader`` module, with the published
torch_nntile's names, signatures and parameter layouts.

``torch_nntile.models`` is the same package under the published torch_nntile's other
name; ``FAMILIES`` lists the modules it also serves (``torch_nntile.models.llama`` is
``torch_nntile.nn.model.llama``).
"""

from torch_nntile.nn.model.bert import BertConfig, BertMlm, BertModel
from torch_nntile.nn.model.common import make_causal_sdpa_mask
from torch_nntile.nn.model.deep_relu import DeepReLU
from torch_nntile.nn.model.dit import DiT, DiTConfig
from torch_nntile.nn.model.gpt2_minimal import GPT2, GPT2Config, GPT2LMHead, GPT2Model
from torch_nntile.nn.model.gpt_neo import GPTNeoCausal, GPTNeoConfig, GPTNeoModel
from torch_nntile.nn.model.gpt_neox import GPTNeoXCausal, GPTNeoXConfig, GPTNeoXModel
from torch_nntile.nn.model.llama import Llama, LlamaCausal, LlamaConfig, LlamaModel
from torch_nntile.nn.model.mlp_mixer import MlpMixer, MlpMixerConfig, MlpMixerCpu
from torch_nntile.nn.model.roberta import RobertaConfig, RobertaMlm, RobertaModel
from torch_nntile.nn.model.t5 import T5Config, T5ForConditionalGeneration, T5Model

FAMILIES = ("bert", "bert_hf_loader", "common", "deep_relu", "dit", "dit_hf_loader", "gpt2_minimal", "gpt2_hf_loader",
            "gpt_neo", "gpt_neo_hf_loader", "gpt_neox", "gpt_neox_hf_loader", "hf_rope_layout", "llama",
            "llama_hf_loader", "mlp_mixer", "roberta", "roberta_hf_loader", "t5", "t5_hf_loader")

__all__ = ["FAMILIES", "BertConfig", "BertMlm", "BertModel", "DeepReLU", "DiT", "DiTConfig", "GPT2", "GPT2Config",
           "GPT2LMHead", "GPT2Model", "GPTNeoCausal", "GPTNeoConfig", "GPTNeoModel", "GPTNeoXCausal", "GPTNeoXConfig",
           "GPTNeoXModel", "Llama", "LlamaCausal", "LlamaConfig", "LlamaModel", "MlpMixer", "MlpMixerConfig",
           "MlpMixerCpu", "RobertaConfig", "RobertaMlm", "RobertaModel", "T5Config", "T5ForConditionalGeneration",
           "T5Model", "make_causal_sdpa_mask"]
