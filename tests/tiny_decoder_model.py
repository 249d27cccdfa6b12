"""A tiny decoder LLM (Llama or Qwen2, saved as its ...ForCausalLM) and a character-level tokenizer with BOS, EOS
and padding tokens, written to a folder by the test itself: no download, loads in ms.

The tokenizer adds BOS (Llama's) or nothing (Qwen2's) and never EOS, as those tokenizers do, so
`HuggingFaceTokenizer` appends the EOS token; `padding_side` is chosen by the test.
"""
from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
CHARACTERS = list(" " + string.ascii_lowercase + string.digits + string.punctuation)


def write_tiny_tokenizer(folder: Path, bos: bool = True, padding_side: str = "right", pad: bool = True) -> None:
    """A WordLevel tokenizer over single characters; `bos`: it adds <s> itself; `pad`: it has a padding token."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate(SPECIAL + CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                                 special_tokens=[("<s>", vocab["<s>"])])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="<pad>" if pad else None,
                                                padding_side=padding_side)
    fast.save_pretrained(folder)


def write_tiny_decoder(folder: Path, architecture: str = "llama", seed: int = 0, dropout: float = 0.0,
                       bos: bool = True, padding_side: str = "right", pad: bool = True) -> Path:
    """Write a 1-layer ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` (hidden 32) and its tokenizer to ``folder``."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(folder, bos=bos, padding_side=padding_side, pad=pad)
    sizes = dict(vocab_size=len(SPECIAL) + len(CHARACTERS), hidden_size=32, intermediate_size=64,
                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 attention_dropout=dropout, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                 tie_word_embeddings=False)
    torch.manual_seed(seed)
    if architecture == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes))
    elif architecture == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**sizes))
    else:
        raise ValueError(f"architecture={architecture!r}: llama or qwen2")
    model.save_pretrained(folder)
    return folder
