"""Export tiny, randomly initialised ResNet/MobileNetV2/BERT/GPT-2/ViT models to tests/models/.

Run with an environment that has torch + transformers (not needed by the tests themselves)::

    python3 -m venv /tmp/vexport
    /tmp/vexport/bin/pip install torch==2.13.0 transformers onnx onnxscript numpy
    /tmp/vexport/bin/python tools/export_models.py [--out tests/models] [--only bert,gpt2]

Architectures come from transformers config classes (no hub access), so the op patterns are the
real ones users get from ``torch.onnx.export`` (legacy TorchScript exporter, ``dynamo=False``);
only the sizes are tiny. Each model is written in float32 and, via ``model.half()``, in float16.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
import transformers
from torch import nn

OPSET = 17
SEQ = 16
IMAGE = 32
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Spec:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.dtype], dict[str, torch.Tensor]]
    outputs: list[str]
    dynamic: dict[str, dict[int, str]]
    opset: int = OPSET
    keep_batchnorm: bool = False  # eval-mode export folds BatchNorm into Conv; PRESERVE keeps the op


class TupleOutputs(nn.Module):
    """Named positional inputs in, a tuple of tensors out: what the TorchScript exporter wants."""

    def __init__(self, model: nn.Module, keys: list[str], **fixed: object) -> None:
        super().__init__()
        self.model, self.keys, self.fixed = model, keys, fixed

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        names = self.input_names
        out = self.model(**dict(zip(names, args, strict=True)), **self.fixed, return_dict=True)
        return tuple(out[k] for k in self.keys)


def perturb_norms(model: nn.Module, gen: torch.Generator) -> None:
    """Give norm layers non-trivial scale/shift/statistics so the tests exercise them (init is 1/0)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
                if m.weight is not None:
                    m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=gen))
                if m.bias is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))


def text_inputs(vocab: int, token_types: bool) -> Callable[[torch.dtype], dict[str, torch.Tensor]]:
    def make(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (2, SEQ), generator=g)
        mask = torch.ones(2, SEQ, dtype=torch.int64)
        mask[1, -3:] = 0  # padded tail: the exporter must keep the mask path
        feeds = {"input_ids": ids, "attention_mask": mask}
        if token_types:
            feeds["token_type_ids"] = torch.cat([torch.zeros(2, SEQ // 2), torch.ones(2, SEQ // 2)], 1).long()
        return feeds

    return make


def image_inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(2, 3, IMAGE, IMAGE, generator=g).to(dtype)}


TEXT_AXES = {0: "batch", 1: "sequence"}
IMAGE_AXES = {0: "batch"}
BERT_AXES = {
    "input_ids": TEXT_AXES,
    "attention_mask": TEXT_AXES,
    "token_type_ids": TEXT_AXES,
    "last_hidden_state": TEXT_AXES,
    "pooler_output": IMAGE_AXES,
}


def bert() -> nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        initializer_range=0.2,
        attn_implementation="eager",
    )
    return transformers.BertModel(cfg)


def gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=100,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        initializer_range=0.2,
        use_cache=False,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(cfg)


def vit() -> nn.Module:
    cfg = transformers.ViTConfig(
        image_size=IMAGE,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        initializer_range=0.2,
        attn_implementation="eager",
    )
    return transformers.ViTModel(cfg)


def resnet() -> nn.Module:
    cfg = transformers.ResNetConfig(
        num_channels=3,
        embedding_size=16,
        hidden_sizes=[32, 64],
        depths=[1, 1],
        layer_type="bottleneck",
        num_labels=10,
    )
    return transformers.ResNetForImageClassification(cfg)


def mobilenet_v2() -> nn.Module:
    cfg = transformers.MobileNetV2Config(
        num_channels=3, image_size=IMAGE, depth_multiplier=0.25, finegrained_output=False, num_labels=10
    )
    model = transformers.MobileNetV2ForImageClassification(cfg)
    # HF initialises convs with std 0.02, which shrinks activations ~100x by the logits; He init keeps
    # values O(1) so the comparison tolerances mean something.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    return model


SPECS = [
    Spec("resnet", resnet, image_inputs, ["logits"], {"pixel_values": IMAGE_AXES, "logits": IMAGE_AXES}),
    # As exported with training=TrainingMode.PRESERVE (or by tools that skip the eval peephole).
    Spec(
        "resnet_bn",
        resnet,
        image_inputs,
        ["logits"],
        {"pixel_values": IMAGE_AXES, "logits": IMAGE_AXES},
        keep_batchnorm=True,
    ),
    Spec(
        "mobilenet_v2",
        mobilenet_v2,
        image_inputs,
        ["logits"],
        {"pixel_values": IMAGE_AXES, "logits": IMAGE_AXES},
    ),
    Spec("bert", bert, text_inputs(100, True), ["last_hidden_state", "pooler_output"], BERT_AXES),
    # Before opset 17 the exporter spells LayerNorm out (ReduceMean/Sub/Pow/Sqrt/Div): many deployed
    # models look like this, and the EP should fuse it back.
    Spec(
        "bert_opset14",
        bert,
        text_inputs(100, True),
        ["last_hidden_state", "pooler_output"],
        BERT_AXES,
        opset=14,
    ),
    Spec(
        "gpt2",
        gpt2,
        text_inputs(100, False),
        ["logits"],
        {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES, "logits": TEXT_AXES},
    ),
    Spec(
        "vit",
        vit,
        image_inputs,
        ["last_hidden_state", "pooler_output"],
        {"pixel_values": IMAGE_AXES, "last_hidden_state": IMAGE_AXES, "pooler_output": IMAGE_AXES},
    ),
]


def export(spec: Spec, out_dir: Path, half: bool) -> Path:
    torch.manual_seed(0)
    model = spec.build()
    perturb_norms(model, torch.Generator().manual_seed(0))
    model.eval()
    dtype = torch.float16 if half else torch.float32
    if half:
        model = model.half()
    feeds = spec.inputs(dtype)
    wrapper = TupleOutputs(model, spec.outputs, **({"use_cache": False} if spec.name == "gpt2" else {}))
    wrapper.input_names = list(feeds)
    path = out_dir / f"{spec.name}{'_fp16' if half else ''}.onnx"
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            tuple(feeds.values()),
            str(path),
            dynamo=False,
            opset_version=spec.opset,
            input_names=list(feeds),
            output_names=spec.outputs,
            dynamic_axes=spec.dynamic,
            do_constant_folding=True,
            training=torch.onnx.TrainingMode.PRESERVE
            if spec.keep_batchnorm
            else torch.onnx.TrainingMode.EVAL,
        )
    model_proto = onnx.load(str(path))
    onnx.checker.check_model(model_proto, full_check=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "models")
    ap.add_argument("--only", default="", help="comma-separated model names")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    report = {}
    for spec in SPECS:
        if only and spec.name not in only:
            continue
        for half in (False, True):
            path = export(spec, args.out, half)
            ops: dict[str, int] = {}
            for node in onnx.load(str(path)).graph.node:
                ops[node.op_type] = ops.get(node.op_type, 0) + 1
            size = path.stat().st_size
            report[path.name] = {"opset": spec.opset, "bytes": size, "ops": dict(sorted(ops.items()))}
            print(f"{path.name}: {size} bytes, {sum(ops.values())} nodes", file=sys.stderr)
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "onnx": onnx.__version__,
                "exporter": "torch.onnx.export(dynamo=False)",
                "models": report,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
