"""The model folders the `program` section trains, written here with random weights (no download): a BERT with
a character-level WordPiece tokenizer (a masked-LM head for `--kind sparse`) and a Llama with a character-level
tokenizer that adds BOS (`HuggingFaceTokenizer` appends EOS), as the program's tests write theirs."""
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
