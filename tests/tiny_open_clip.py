"""A tiny SigLIP architecture registered with open_clip by the test itself (open_clip's own SigLIP configs build
their text tower and tokenizer from the Hugging Face hub, which this project never downloads): one-block towers
of width 32 on 32 x 32 images, open_clip's own (CLIP) tokenizer, and the config key that makes it SigLIP,
`init_logit_bias`."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

TINY_SIGLIP = "gradcache-test-tiny-sigmoid"  # "siglip" in a name makes open_clip download a tokenizer
TINY_SIGLIP_BIAS = -10.0  # its init_logit_bias, SigLIP's usual start
TINY_SIGLIP_CONFIG = {
    "embed_dim": 16,
    "init_logit_bias": TINY_SIGLIP_BIAS,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def register_tiny_siglip() -> str:
    """Register `TINY_SIGLIP` with open_clip (once per process); returns its name."""
    import open_clip

    if open_clip.get_model_config(TINY_SIGLIP) is None:
        path = Path(tempfile.mkdtemp(prefix="open_clip_configs_")) / f"{TINY_SIGLIP}.json"
        path.write_text(json.dumps(TINY_SIGLIP_CONFIG))
        open_clip.add_model_config(path)
    return TINY_SIGLIP
