"""Encoders for GradCache training: image and text encoders, heads, SimCLR and CLIP wrappers, tokenizer."""

from gradcache.models.clip import CLIP, EncoderTower
from gradcache.models.convnet import ConvNet
from gradcache.models.factory import (
    IMAGE_ENCODER_PRESETS,
    ConvNetConfig,
    ResNetConfig,
    ViTConfig,
    build_image_encoder,
)
from gradcache.models.heads import LinearProjection, ProjectionHead
from gradcache.models.bi_encoder import BiEncoder
from gradcache.models.hf_tokenizer import HuggingFaceTokenizer
from gradcache.models.huggingface import HuggingFaceEncoder
from gradcache.models.pretrained import PretrainedConfig, from_pretrained, read_pretrained_config
from gradcache.models.resnet import ResNetEncoder
from gradcache.models.simclr import SimCLRModel
from gradcache.models.text import TextEncoder
from gradcache.models.tokenizer import ByteTokenizer
from gradcache.models.vision_language import VisionLanguageEncoder, language_model_lora_targets
from gradcache.models.vision_language_collator import VisionLanguageCollator, VisionLanguageInput
from gradcache.models.vision_language_folder import (
    VisionLanguageFolder,
    is_vision_language_folder,
    read_vision_language_folder,
)
from gradcache.models.vision_language_presets import (
    VISION_LANGUAGE_PRESETS,
    VisionLanguagePreset,
    build_vision_language_model,
)
from gradcache.models.vit import ViTEncoder

__all__ = [
    "CLIP",
    "ByteTokenizer",
    "ConvNet",
    "ConvNetConfig",
    "EncoderTower",
    "BiEncoder",
    "HuggingFaceEncoder",
    "HuggingFaceTokenizer",
    "IMAGE_ENCODER_PRESETS",
    "LinearProjection",
    "PretrainedConfig",
    "ProjectionHead",
    "ResNetConfig",
    "ResNetEncoder",
    "SimCLRModel",
    "TextEncoder",
    "ViTConfig",
    "ViTEncoder",
    "VisionLanguageCollator",
    "VisionLanguageEncoder",
    "VisionLanguageFolder",
    "VisionLanguageInput",
    "VisionLanguagePreset",
    "VISION_LANGUAGE_PRESETS",
    "build_image_encoder",
    "build_vision_language_model",
    "from_pretrained",
    "is_vision_language_folder",
    "language_model_lora_targets",
    "read_pretrained_config",
    "read_vision_language_folder",
]
