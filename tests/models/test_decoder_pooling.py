"""Decoder embedders: last-token pooling (left and right padding, against a brute-force index), the EOS rule of the
tokenizer, causal-LM folders loaded as their base model, prompts and their exclusion from mean pooling, and
GradCache equal to the full batch on every parameter of a tiny Llama pooled by its last token."""
import copy

import pytest
import torch

from gradcache import FullBatch, GradCache, losses
from gradcache.models import HuggingFaceEncoder, HuggingFaceTokenizer
from gradcache.models.huggingface import check_weights
from tests.tiny_decoder_model import write_tiny_decoder
from tests.tiny_text_model import write_tiny_bert

transformers = pytest.importorskip("transformers", reason='the dev extra installs it: pip install -e ".[dev]"')

TEXTS = ["who bakes bread?", "a", "the miller of the northern valley grinds wheat", "ok then"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write_tiny_decoder(tmp_path_factory.mktemp("llama"), "llama")


def _hidden(encoder: HuggingFaceEncoder, tokens: dict) -> torch.Tensor:
    with torch.no_grad():
        return encoder.model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]).last_hidden_state


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_last_token_pooling_against_a_brute_force_index(tmp_path, architecture, padding_side):
    folder = write_tiny_decoder(tmp_path, architecture, padding_side=padding_side)
    encoder = HuggingFaceEncoder(folder, pooling="last").eval()
    tokens = HuggingFaceTokenizer(folder, max_length=32)(TEXTS)
    assert tokens["attention_mask"].eq(0).any(), "the batch has padding"
    hidden = _hidden(encoder, tokens)  # (B, L, H)
    pooled = encoder(**tokens)
    for row in range(len(TEXTS)):
        last = max(position for position in range(tokens["attention_mask"].shape[1])
                   if tokens["attention_mask"][row, position] == 1)
        assert tokens["input_ids"][row, last] == encoder.model.config.eos_token_id  # the appended EOS
        torch.testing.assert_close(pooled[row], hidden[row, last])


def test_left_and_right_padding_pool_the_same_embedding(tmp_path):
    left = write_tiny_decoder(tmp_path / "left", "llama", padding_side="left")
    right = write_tiny_decoder(tmp_path / "right", "llama", padding_side="right")
    encoders = [HuggingFaceEncoder(folder, pooling="last").double().eval() for folder in (left, right)]
    batches = [HuggingFaceTokenizer(folder, max_length=32)(TEXTS) for folder in (left, right)]
    assert batches[0]["attention_mask"][:, 0].eq(0).any() and batches[1]["attention_mask"][:, -1].eq(0).any()
    with torch.no_grad():
        torch.testing.assert_close(encoders[0](**batches[0]), encoders[1](**batches[1]), rtol=1e-9, atol=1e-9)


def test_the_eos_token_is_appended_once_and_kept_by_truncation(tmp_path, llama):
    tokenize = HuggingFaceTokenizer(llama, max_length=6)
    ids = tokenize(["abcdefghij", "ab"])["input_ids"]
    assert ids[0].tolist() == [2, *ids[0, 1:5].tolist(), 3]  # BOS, four characters, EOS (truncated)
    assert ids[1, :4].tolist() == [2, ids[1, 1].item(), ids[1, 2].item(), 3]
    # a tokenizer that appends it already (this one, saved) gets no second EOS
    tokenize.tokenizer.save_pretrained(tmp_path / "saved")
    again = HuggingFaceTokenizer(tmp_path / "saved", max_length=6)(["abcdefghij", "ab"])["input_ids"]
    assert torch.equal(again, ids)


@pytest.mark.parametrize("switch", [True, False], ids=["add_bos_token", "own-template"])
def test_the_eos_rule_keeps_what_the_tokenizer_adds_itself(tmp_path, switch):
    """A tokenizer that adds BOS by transformers' add_bos_token switch, or by a template of its own: both keep
    their BOS and end with one EOS, also after save_pretrained and a reload (what sentence-transformers reads)."""
    import string

    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from gradcache.models.hf_tokenizer import end_with_eos

    vocab = {token: index for index, token in enumerate(["<pad>", "<unk>", "<s>", "</s>", *string.ascii_lowercase])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    if not switch:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>", **({"add_bos_token": True} if switch else {}))
    assert tokenizer("ab")["input_ids"] == [2, 4, 5]
    end_with_eos(tokenizer)
    assert tokenizer("ab")["input_ids"] == [2, 4, 5, 3]
    tokenizer.save_pretrained(tmp_path)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path)("ab")["input_ids"] == [2, 4, 5, 3]


def test_a_tokenizer_without_eos_appends_nothing_and_pools_its_own_last_token(tmp_path):
    folder = write_tiny_bert(tmp_path)
    tokens = HuggingFaceTokenizer(folder, max_length=16)(["ab", "abcd"])
    sep = HuggingFaceTokenizer(folder, 16).tokenizer.sep_token_id
    assert tokens["input_ids"][0, :4].tolist()[-1] == sep and tokens["input_ids"][0, 4] == 0  # [CLS] a b [SEP] [PAD]
    encoder = HuggingFaceEncoder(folder, pooling="last").eval()
    hidden = _hidden(encoder, tokens)
    torch.testing.assert_close(encoder(**tokens), torch.stack([hidden[0, 3], hidden[1, 5]]))


def test_a_tokenizer_without_padding_pads_with_eos(tmp_path):
    folder = write_tiny_decoder(tmp_path, "llama", pad=False)
    tokens = HuggingFaceTokenizer(folder, max_length=16)(["ab", "abcd"])
    assert tokens["input_ids"][0, -1] == 3 and tokens["attention_mask"][0].tolist() == [1] * 4 + [0] * 2


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_a_causal_lm_folder_loads_as_its_base_model(tmp_path, architecture):
    folder = write_tiny_decoder(tmp_path, architecture)
    check_weights(folder)  # the model. prefix of the checkpoint's names is the base model's
    encoder = HuggingFaceEncoder(folder, pooling="last")
    causal = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert type(encoder.model) is type(causal.model)
    assert encoder.out_dim == 32
    for (name, ours), theirs in zip(encoder.model.state_dict().items(), causal.model.state_dict().values()):
        assert torch.equal(ours, theirs), name


def test_a_tampered_causal_lm_config_is_refused(tmp_path):
    import json

    folder = write_tiny_decoder(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not hold the model its config.json describes"):
        check_weights(folder)


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_prompt_left_out_of_mean_pooling_against_brute_force(tmp_path, padding_side):
    folder = write_tiny_decoder(tmp_path, "llama", padding_side=padding_side)
    tokenize = HuggingFaceTokenizer(folder, max_length=32)
    prompt = "query: "
    tokens = tokenize(TEXTS, prompt=prompt)
    prompted = tokenize([prompt + text for text in TEXTS])
    assert torch.equal(tokens["input_ids"], prompted["input_ids"])  # the prompt is prepended text
    # BOS and the prompt's characters, its EOS left out
    assert tokens["prompt_length"].tolist() == [1 + len(prompt)] * len(TEXTS)
    excluded = HuggingFaceEncoder(folder, pooling="mean", include_prompt=False).eval()
    included = HuggingFaceEncoder(folder, pooling="mean").eval()
    hidden = _hidden(excluded, tokens)
    mask = tokens["attention_mask"]
    for row, embedding in enumerate(excluded(**tokens)):
        real = [position for position in range(mask.shape[1]) if mask[row, position] == 1]
        kept = real[tokens["prompt_length"][row]:]
        torch.testing.assert_close(embedding, hidden[row, kept].mean(dim=0))
        torch.testing.assert_close(included(**tokens)[row], hidden[row, real].mean(dim=0))


def test_include_prompt_false_needs_mean_pooling(llama):
    with pytest.raises(ValueError, match="include_prompt=False.*pooling='last'"):
        HuggingFaceEncoder(llama, pooling="last", include_prompt=False)
    with pytest.raises(ValueError, match="pooling='max' is not supported.*'last'"):
        HuggingFaceEncoder(llama, pooling="max")
    with pytest.raises(ValueError, match="prompt='' is empty"):
        HuggingFaceTokenizer(llama, 8)(["a"], prompt="")


def test_a_sentence_transformers_lasttoken_folder_pools_by_the_last_token(tmp_path):
    import json

    folder = write_tiny_decoder(tmp_path, "qwen2")
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    for settings in ({"pooling_mode_lasttoken": True}, {"pooling_mode": "lasttoken"}):
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **settings}))
        assert HuggingFaceEncoder(folder).pooling == "last"


def _towers_and_batches(folder, pooling: str, include_prompt: bool):
    torch.manual_seed(0)
    query = HuggingFaceEncoder(folder, pooling=pooling, include_prompt=include_prompt).double()
    passage = copy.deepcopy(query)
    loss_fn = losses.ClipLoss(temperature=0.1, learnable=True).double()  # a loss parameter too
    tokenize = HuggingFaceTokenizer(folder, max_length=32)
    batches = (tokenize(TEXTS, prompt="q: "), tokenize([text[::-1] for text in TEXTS], prompt="passage: "))
    return [query, passage, loss_fn], batches


def _gradients(modules) -> list[torch.Tensor]:
    grads = [p.grad.clone() for module in modules for p in module.parameters()]
    assert all(grad.abs().sum() > 0 for grad in grads)
    return grads


@pytest.mark.parametrize("pooling,include_prompt", [("last", True), ("mean", False)])
def test_gradcache_with_chunk_tokens_equals_the_full_batch_on_every_parameter(tmp_path, pooling, include_prompt):
    """Rows regrouped by length (chunk_tokens) and padding trimmed per chunk: prompt_length travels with its rows."""
    folder = write_tiny_decoder(tmp_path, "llama", padding_side="right")
    results = []
    for chunked in (False, True):
        (query, passage, loss_fn), batches = _towers_and_batches(folder, pooling, include_prompt)
        if chunked:
            strategy = GradCache([query, passage], loss_fn, chunk_size=3, trim_padding=True, chunk_tokens=[40, None])
        else:
            strategy = FullBatch([query, passage], loss_fn)
        results.append((strategy.step(*batches), _gradients([query, passage, loss_fn])))
    (full_loss, full), (cached_loss, cached) = results
    torch.testing.assert_close(cached_loss, full_loss, rtol=1e-10, atol=1e-10)
    assert len(full) == len(cached)
    for cached_grad, full_grad in zip(cached, full):
        torch.testing.assert_close(cached_grad, full_grad, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_gradcache_with_dropout_equals_a_chunked_forward_with_a_graph(tmp_path, padding_side):
    """Attention dropout on: the reference draws the same masks (the same chunks, trimmed alike, in the same
    order) in one pass with a graph; GradCache replays them when it re-encodes."""
    from gradcache.inputs import split, trim_padding

    folder = write_tiny_decoder(tmp_path, "llama", dropout=0.3, padding_side=padding_side)
    results = []
    for cached in (False, True):
        (query, passage, loss_fn), batches = _towers_and_batches(folder, "last", True)
        torch.manual_seed(1)
        if cached:
            loss = GradCache([query, passage], loss_fn, chunk_size=3, trim_padding=True).step(*batches)
        else:
            embeddings = [torch.cat([tower(**trim_padding(chunk)) for chunk in split(batch, 3)])
                          for tower, batch in zip((query, passage), batches)]
            loss = loss_fn(*embeddings)
            loss.backward()
        results.append((loss.detach(), _gradients([query, passage, loss_fn])))
    (want_loss, want), (got_loss, got) = results
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-10, atol=1e-10)
    for got_grad, want_grad in zip(got, want):
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-8, atol=1e-10)
