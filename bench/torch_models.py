"""The benchmark's PyTorch modules, rebuilt identically (seeded random weights) wherever they are needed.

``export_models.py`` exports these modules and ``run.py`` times the very same ones under torch eager and
torch.compile, so every system computes the same function: weights come from ``torch.manual_seed(0)``
on the CPU (the same numbers on every machine for one torch/transformers version), in float32, and are
only then moved to the device and, for fp16, halved.

Each wrapper has a fixed positional signature (the order of ``specs.MODELS[name].inputs``) and returns
a tuple of tensors (the order of ``.outputs``), which is what ``torch.onnx.export`` wants.
"""

from __future__ import annotations

import specs
import torch
from torch import nn

SEED = 0


class Vision(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.net(images),)


class Bert(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        out = self.net(**feeds, return_dict=True)
        return out.last_hidden_state, out.pooler_output


class Gpt2(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor]:
        # No KV cache: one full-sequence forward pass, with no past_key_values outputs to export.
        out = self.net(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
        return (out.last_hidden_state,)


def _resnet50(tiny: bool) -> nn.Module:
    import torchvision

    if tiny:  # same blocks, one per stage and narrow: for debugging the harness on a CPU
        from torchvision.models.resnet import Bottleneck, ResNet

        return Vision(ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=8))
    return Vision(torchvision.models.resnet50(weights=None))


def _bert(tiny: bool) -> nn.Module:
    import transformers

    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    # "eager" attention exports as explicit MatMul/Softmax; SDPA paths export less cleanly.
    cfg = transformers.BertConfig(attn_implementation="eager", **(small if tiny else {}))
    return Bert(transformers.BertModel(cfg))


def _gpt2(tiny: bool) -> nn.Module:
    import transformers

    small = dict(n_embd=32, n_layer=2, n_head=2)
    cfg = transformers.GPT2Config(use_cache=False, attn_implementation="eager", **(small if tiny else {}))
    return Gpt2(transformers.GPT2Model(cfg))


BUILDERS = {"resnet50": _resnet50, "bert_base": _bert, "gpt2": _gpt2}


def build(name: str, dtype: str, device: str, tiny: bool = False) -> nn.Module:
    """The seeded module for ``name`` in eval mode on ``device``, halved for ``dtype == 'fp16'``."""
    torch.manual_seed(SEED)
    with torch.device("cpu"):
        module = BUILDERS[name](tiny).eval()
    module = module.to(device)
    return module.half() if dtype == "fp16" else module


def example_inputs(name: str, batch: int, dtype: str, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """The same seeded values ``run.py`` feeds to ORT, as tensors on ``device``, in signature order."""
    feeds = specs.make_feeds(specs.MODELS[name], batch, dtype, seed)
    return tuple(torch.from_numpy(feeds[i.name]).to(device) for i in specs.MODELS[name].inputs)
