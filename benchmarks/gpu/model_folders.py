"""The model folders the `program` section trains, written here with random weights (no download): a BERT with
a character-level WordPiece tokenizer (a masked-LM head for `--kind sparse`), a Llama with a character-level
tokenizer that adds BOS (`HuggingFaceTokenizer` appends EOS), as the program's tests write theirs, and a Qwen2-VL
of the `vlm` section's shape with its processor over a few words, and rows of text and PNG images for it."""
from __future__ import annotations

import string
from pathlib import Path

import torch

CHARACTERS = list(string.ascii_lowercase + string.digits + string.punctuation)


def write_bert(folder: Path, hidden: int, layers: int, masked_lm: bool = False, dropout: float = 0.1) -> Path:
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + CHARACTERS + [f"##{c}" for c in CHARACTERS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=128,
                                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config) if masked_lm else transformers.BertModel(config)
    model.save_pretrained(folder)
    return folder


def write_llama(folder: Path, hidden: int, layers: int) -> Path:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(["<pad>", "<unk>", "<s>", "</s>", " "] + CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", vocab["<s>"])])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>", pad_token="<pad>", padding_side="right").save_pretrained(folder)
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


VLM_WORDS = ["a", "red", "blue", "green", "square", "circle", "photo", "of", "the", "shape", "on", "grey"]


def write_qwen2_vl(folder: Path, size) -> Path:
    """A random Qwen2-VL of `size` (a `benchmarks.gpu.sizes.VlmSize`: the language model's and the tower's widths
    and depths; a word-level vocabulary over VLM_WORDS instead of 151,936 tokens) in bf16, and its processor
    resizing every image to `size.image_side` squared pixels (patch 14, merge 2), saved with `save_pretrained`."""
    from gradcache.models import VisionLanguagePreset, build_vision_language_model

    pixels = size.image_side ** 2
    preset = VisionLanguagePreset(hidden_size=size.hidden, layers=size.layers, heads=size.heads,
                                  key_value_heads=size.kv_heads, intermediate_size=size.intermediate,
                                  vision_width=size.vision_width, vision_depth=size.vision_depth,
                                  vision_heads=size.vision_heads, patch_size=14, min_pixels=pixels, max_pixels=pixels,
                                  max_positions=4096)
    model, processor = build_vision_language_model(preset, VLM_WORDS)
    model.to(torch.bfloat16).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def write_vlm_rows(folder: Path, count: int, image_side: int) -> Path:
    """`count` rows of `rows.jsonl` in `folder` cycling text -> image, image -> text and image + text -> text,
    their PNG images of `image_side` pixels beside it (one colour each, from the row's number)."""
    import json

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    colours = {"red": (200, 30, 30), "blue": (30, 30, 200), "green": (30, 200, 30)}
    lines = []
    for k in range(count):
        name, colour = list(colours.items())[k % len(colours)]
        image = f"{k}.png"
        Image.new("RGB", (image_side, image_side), colour).save(folder / image)
        caption = f"a {name} square photo {' '.join(VLM_WORDS[k % 7:k % 7 + 3])}"
        row = ({"query": caption, "positive_image": image}, {"query_image": image, "positive": caption},
               {"query": "the shape", "query_image": image, "positive": caption})[k % 3]
        lines.append(json.dumps(row))
    (folder / "rows.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / "rows.jsonl"
