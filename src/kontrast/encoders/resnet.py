"""A compact ResNet encoder with a CIFAR or ImageNet stem and a width multiplier.

ResNet: He, Zhang, Ren & Sun, "Deep Residual Learning for Image Recognition", CVPR 2016,
https://arxiv.org/abs/1512.03385. The blocks follow torchvision's layout (the stride of a
Bottleneck sits on its 3×3 conv, "ResNet v1.5"), and the module names are torchvision's: with
``stem="imagenet"`` and ``width=1`` the state_dict matches torchvision's ``resnet18/34/50``
key for key and shape for shape, minus ``fc`` (its pretrained weights load directly).

``stem="cifar"`` is the small-image variant used by SimCLR's CIFAR experiments, lightly and
solo-learn: one 3×3 stride-1 conv and no max-pool, so a 32×32 input keeps 32×32 in the first
stage instead of being cut to 8×8 before any residual block runs.

The encoder holds no head: ``forward`` returns globally average-pooled features ``[B, dim]``;
``forward_features`` returns the last feature map ``[B, C, h, w]`` for dense/local methods, and
``forward_maps`` the map after every stage (multiscale methods).
"""

from __future__ import annotations

import torch
from torch import nn

from kontrast.errors import UserError
from kontrast.registry import ENCODERS

STEMS = ("cifar", "imagenet")
STAGE_CHANNELS = (64, 128, 256, 512)  # base channel counts of the four stages at width 1


def conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    """3×3 convolution with padding 1 and no bias (a BatchNorm follows)."""
    return nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    """1×1 convolution without bias (a BatchNorm follows)."""
    return nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride, bias=False)


def shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    """Projection shortcut (1×1 conv + BN) where shape changes, identity otherwise (option B)."""
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(conv1x1(c_in, c_out, stride), nn.BatchNorm2d(c_out))


class BasicBlock(nn.Module):
    """Two 3×3 convs (ResNet-18/34). Output channels = ``planes``."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = conv3x3(c_in, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = shortcut(c_in, planes, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))  # [B, planes, H/s, W/s]
        out = self.bn2(self.conv2(out))  # [B, planes, H/s, W/s]
        return self.relu(out + self.downsample(x))


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3 (carries the stride), 1×1 expand ×4 (ResNet-50). Output = 4·planes."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1):
        super().__init__()
        c_out = planes * self.expansion
        self.conv1 = conv1x1(c_in, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, c_out)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = shortcut(c_in, c_out, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))  # [B, planes, H, W]
        out = self.relu(self.bn2(self.conv2(out)))  # [B, planes, H/s, W/s]
        out = self.bn3(self.conv3(out))  # [B, 4·planes, H/s, W/s]
        return self.relu(out + self.downsample(x))


def scaled(channels: int, width: float) -> int:
    """``channels · width`` rounded to an int, at least 1."""
    return max(1, round(channels * width))


def make_stem(stem: str, c_out: int) -> tuple[nn.Conv2d, nn.Module]:
    """(first conv, pool): CIFAR 3×3/1, no pool (keeps H×W); ImageNet 7×7/2 + max-pool 3×3/2 (H/4)."""
    if stem == "cifar":
        return conv3x3(3, c_out), nn.Identity()
    if stem == "imagenet":
        conv = nn.Conv2d(3, c_out, kernel_size=7, stride=2, padding=3, bias=False)
        return conv, nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    raise UserError(f"unknown stem {stem!r}; choose one of: {', '.join(STEMS)}")


def make_stage(block: type, c_in: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    """``blocks`` residual blocks; only the first one changes stride and channel count."""
    layers = [block(c_in, planes, stride)]
    layers += [block(planes * block.expansion, planes) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


def init_weights(model: nn.Module, zero_init_residual: bool, torch_init: bool = False) -> None:
    """torchvision's init: Kaiming-normal (fan_out, ReLU) convs, BN γ=1 β=0.

    ``zero_init_residual`` sets each block's last BN γ to 0 so every block starts as the
    identity (Goyal et al. 2017, https://arxiv.org/abs/1706.02677). ``torch_init`` leaves the
    convs as ``nn.Conv2d`` draws them (Kaiming-uniform with a = √5: a standard deviation of
    1/√(3 fan_in), against √(2/fan_out)), as lightly's ``ResNetGenerator`` does.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            if not torch_init:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if zero_init_residual:
        for m in model.modules():
            if isinstance(m, (BasicBlock, Bottleneck)):
                nn.init.zeros_(m.last_bn.weight)


class ResNet(nn.Module):
    """ResNet encoder: ``forward(x [B,3,H,W]) -> [B, dim]``, no classification head.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        layers: blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        stem: ``"cifar"`` (3×3/1, no max-pool) or ``"imagenet"`` (7×7/2 + max-pool).
        width: multiplier on every channel count (stem and stages), each rounded, ≥ 1.
        zero_init_residual: start every residual block as the identity.
        torch_init: convolutions keep PyTorch's default init, not torchvision's (:func:`init_weights`).

    Attributes:
        dim: feature size of ``forward`` (= channels of the last stage), known at construction.
    """

    def __init__(
        self,
        block: type,
        layers: tuple[int, int, int, int],
        *,
        stem: str = "cifar",
        width: float = 1.0,
        zero_init_residual: bool = False,
        torch_init: bool = False,
    ):
        super().__init__()
        if not width > 0:
            raise UserError(f"encoder width must be > 0, got {width}")
        planes = [scaled(c, width) for c in STAGE_CHANNELS]
        # torchvision's attribute names, so its state_dict (minus fc) loads as is
        self.conv1, self.maxpool = make_stem(stem, planes[0])
        self.bn1 = nn.BatchNorm2d(planes[0])
        self.relu = nn.ReLU(inplace=True)
        c_in = planes[0]
        for i, (p, n) in enumerate(zip(planes, layers)):
            stage = make_stage(block, c_in, p, n, stride=1 if i == 0 else 2)
            self.add_module(f"layer{i + 1}", stage)
            c_in = p * block.expansion
        self.dim: int = c_in
        self.map_dims: tuple[int, ...] = tuple(p * block.expansion for p in planes)  # channels of forward_maps
        # the total stride (8 or 32): a smaller view leaves the last stages a single padded position, where BatchNorm
        # normalises the rounding of a near-constant channel (bf16 at 4-16 px through the ImageNet stem: non-finite
        # gradients by step 2 in SimCLR, Barlow Twins and CLIP; 32 px and the CIFAR stem from 8 px train)
        self.min_size: int = 8 if stem == "cifar" else 32
        init_weights(self, zero_init_residual, torch_init)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Last feature map ``[B, dim, h, w]``: h = H/8 (cifar stem) or H/32 (imagenet stem)."""
        x = self.relu(self.bn1(self.conv1(x)))  # [B, c0, H, W] cifar · [B, c0, H/2, W/2] imagenet
        x = self.maxpool(x)  # identity (cifar) · [B, c0, H/4, W/4] imagenet
        x = self.layer1(x)
        x = self.layer2(x)  # stride 2
        x = self.layer3(x)  # stride 2
        return self.layer4(x)  # stride 2

    def forward_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The feature map after each stage, finest first: ``[B, map_dims[s], h_s, w_s]``.

        CIFAR stem, 32 px: 32, 16, 8, 4 positions per side (local/multiscale methods: AMDIM, YADIM).
        """
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # [B, c0, H, W] cifar · [B, c0, H/4, W/4] imagenet
        maps = []
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)  # stride 1, 2, 2, 2
            maps.append(x)
        return maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Globally average-pooled features ``[B, dim]``."""
        return self.forward_features(x).mean(dim=(2, 3))  # [B, dim, h, w] -> [B, dim]


@ENCODERS.register("resnet18")
def resnet18(**kw) -> ResNet:
    """ResNet-18: BasicBlock, (2, 2, 2, 2); dim 512·width."""
    return ResNet(BasicBlock, (2, 2, 2, 2), **kw)


@ENCODERS.register("resnet34")
def resnet34(**kw) -> ResNet:
    """ResNet-34: BasicBlock, (3, 4, 6, 3); dim 512·width."""
    return ResNet(BasicBlock, (3, 4, 6, 3), **kw)


@ENCODERS.register("resnet50")
def resnet50(**kw) -> ResNet:
    """ResNet-50: Bottleneck, (3, 4, 6, 3); dim 2048·width."""
    return ResNet(Bottleneck, (3, 4, 6, 3), **kw)
