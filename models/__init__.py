"""Encoders for GradCache training: image and text encoders, heads, SimCLR and CLIP wrappers, tokenizer."""

from models.clip import CLIP, EncoderTower
from models.convnet import ConvNet
from models.factory import (
    IMAGE_ENCODER_PRESETS,
    ConvNetConfig,
    ResNetConfig,
    ViTConfig,
    build_image_encoder,
)
from models.heads import LinearProjection, ProjectionHead
from models.huggingface import HuggingFaceEncoder
from models.resnet import ResNetEncoder
from models.simclr import SimCLRModel
from models.text import TextEncoder
from models.tokenizer import ByteTokenizer
from models.vit import ViTEncoder

__all__ = [
    "CLIP",
    "ByteTokenizer",
    "ConvNet",
    "ConvNetConfig",
    "EncoderTower",
    "HuggingFaceEncoder",
    "IMAGE_ENCODER_PRESETS",
    "LinearProjection",
    "ProjectionHead",
    "ResNetConfig",
    "ResNetEncoder",
    "SimCLRModel",
    "TextEncoder",
    "ViTConfig",
    "ViTEncoder",
    "build_image_encoder",
]
