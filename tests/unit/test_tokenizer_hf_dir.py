"""Loading tokenizers from a HF model folder and from a byte-level ("gpt2") GGUF vocabulary,
checked against HF transformers and against the `tokenizers` BPE they were written from."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from inferd.errors import ModelLoadError
from inferd.loader.gguf_file import GGUFFile
from inferd.tokenizer import Tokenizer, bpe_merges, gguf_vocab, load_tokenizer

CORPUS = [
    "Hello world, this is a tiny test corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog 123 456 7890.",
    "Héllo wörld, ünïcode façade; 日本語 and emoji 😀 too.",
    "def main():\n    return 42\n",
] * 20
TEXTS = ["Hello world", " leading", "trailing  ", "Héllo 日本 😀!", "x\n\n  y", "", "The dog 12345"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
QWEN2_SPLIT = gguf_vocab.SPLIT_BY_PRE["qwen2"]


def _train_byte_level(split: str | None = None, vocab_size: int = 320) -> Backend:
    tok = Backend(models.BPE())
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_tok")
    backend = _train_byte_level()
    # Like real checkpoints, tokenizer.json itself says that BOS starts every sequence.
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    backend.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True},
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "chat_template": TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 4]}))
    return folder


@pytest.fixture(scope="module")
def hf_reference(hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hf_dir))


def test_hf_dir_encode_decode_match_transformers(hf_dir, hf_reference):
    tok = Tokenizer.from_hf_dir(hf_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_reference(text)["input_ids"]
        assert ids[0] == tok.bos_token_id == 1  # tokenizer.json's post-processor adds BOS
        assert tok.encode(text, add_special_tokens=False) == ids[1:]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_reference.decode(
                ids, skip_special_tokens=skip
            )
        assert tok.decode(ids) == text


def test_hf_dir_special_tokens_and_stop_ids(hf_dir, hf_reference):
    tok = load_tokenizer(hf_dir)
    assert tok.eos_token_id == hf_reference.eos_token_id == 2
    assert tok.eos_token_ids == (2, 4)  # tokenizer EOS, then generation_config.json's others
    assert tok.pad_token_id == hf_reference.pad_token_id == 3
    assert tok.vocab_size == len(hf_reference)
    assert tok.special_tokens == {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"
    }  # fmt: skip
    assert set(tok.all_special_ids) == set(range(6))


def test_hf_dir_chat_template_matches_transformers(hf_dir, hf_reference):
    tok = Tokenizer.from_hf_dir(hf_dir)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    for add in (True, False):
        expected = hf_reference.apply_chat_template(
            messages, add_generation_prompt=add, tokenize=False
        )
        assert tok.apply_chat_template(messages, add_generation_prompt=add) == expected
    assert tok.apply_chat_template(messages).endswith("Yo</s><|assistant|>")


def test_chat_template_file_takes_precedence(tmp_path, hf_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((hf_dir / name).read_bytes())
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "json {{ 1 }}"}))
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template([]) == "json 1"
    (tmp_path / "chat_template.jinja").write_text("jinja {{ 2 }}")
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template([]) == "jinja 2"
    override = Tokenizer.from_hf_dir(tmp_path, chat_template="arg {{ 3 }}")
    assert override.apply_chat_template([]) == "arg 3"


def test_config_added_tokens_and_named_list_template(tmp_path, hf_dir):
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    config = {
        "eos_token": "</s>",
        "added_tokens_decoder": {"999": {"content": "<tool>", "special": True}},
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "default {{ messages | length }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_hf_dir(tmp_path)
    tool_id = tok.token_to_id("<tool>")
    assert tool_id is not None and tok.encode("a<tool>b", add_special_tokens=False).count(tool_id)
    assert tok.decode(tok.encode("a<tool>b")) == "ab"  # special: skipped by default
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "default 1"
    assert tok.bos_token_id is None  # not declared, though tokenizer.json still writes <s>
    assert tok.encode("a") == [1, *tok.encode("a", add_special_tokens=False)]


def test_config_bos_flag_applies_only_without_a_post_processor(tmp_path, hf_dir):
    state = json.loads((hf_dir / "tokenizer.json").read_text())
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text(json.dumps({**state, "post_processor": None}))
    ids = Tokenizer.from_hf_dir(tmp_path).encode("Hello")
    assert ids[0] == 1 and ids[-1] == 2  # the flags are the only statement: honoured
    config["add_bos_token"] = False  # ...but tokenizer.json's own rule wins over them
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    assert Tokenizer.from_hf_dir(tmp_path).encode("Hello")[0] == 1


def test_missing_tokenizer_json_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    with pytest.raises(ModelLoadError, match="no such"):
        load_tokenizer(tmp_path / "missing")


# --- byte-level GGUF vocabulary ----------------------------------------------------------------


def _write_gguf(path, arch: str, model: str, tokens, types, **fields) -> None:
    """A GGUF with tokenizer metadata, the config keys HF needs to accept it, one tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(fields.pop("pre", "default"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if "merges" in fields:
        writer.add_token_merges(fields.pop("merges"))
    if "scores" in fields:
        writer.add_token_scores(fields.pop("scores"))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if "add_bos" in fields:
        writer.add_add_bos_token(fields.pop("add_bos"))
    assert not fields, fields
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def byte_level_gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf_tok")
    original = _train_byte_level(QWEN2_SPLIT)
    state = json.loads(original.to_str())
    vocab, merges = state["model"]["vocab"], state["model"]["merges"]
    tokens = sorted(vocab, key=vocab.get)
    types = [3 if t.startswith("<") and t.endswith(">") else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    path = folder / "tiny.gguf"
    _write_gguf(path, "qwen2", "gpt2", tokens, types, merges=merges, pre="qwen2", add_bos=False)
    return path, original


def test_gguf_byte_level_matches_original_and_transformers(byte_level_gguf, monkeypatch, tmp_path):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    path, original = byte_level_gguf
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = Tokenizer.from_gguf(GGUFFile(path))
    for text in [*TEXTS, "<|user|>hi<|assistant|>"]:
        ids = tok.encode(text)
        assert ids == original.encode(text).ids == hf(text)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids)
    assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    assert tok.chat_template is None  # qwen2 has no bundled default
    with pytest.raises(ValueError, match="--chat-template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_gguf_tokenizer_cache_is_written_once_and_reused(byte_level_gguf, monkeypatch, tmp_path):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    path, original = byte_level_gguf
    first = Tokenizer.from_gguf(GGUFFile(path))
    cached = sorted((tmp_path / "tokenizers").iterdir())
    # the tokenizer and its checksum (inferd/cache.py); no temporary file left behind
    assert [p.suffix for p in cached] == [".json", ".sum"]
    assert (
        cached[0].stem
        == gguf_vocab.GGUFVocab.from_metadata(GGUFFile(path).metadata, "qwen2").cache_key()
    )

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been used")

    monkeypatch.setattr(gguf_vocab, "build_tokenizer_json", no_rebuild)
    second = Tokenizer.from_gguf(GGUFFile(path))
    assert second.encode("Hello world") == first.encode("Hello world")
    cached[0].write_text("not json")  # a damaged cache is rebuilt, not fatal
    monkeypatch.undo()
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    assert Tokenizer.from_gguf(GGUFFile(path)).encode("Hi") == original.encode("Hi").ids


def test_derive_and_prune_merges_are_exact():
    tokens = ["a", "b", "c", "ab", "bc", "abc", "cab", "ca"]
    merges = bpe_merges.derive_merges(tokens)
    # Position order: tokens in file order, longer left part first.
    assert merges == [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc"), ("ca", "b"),
                      ("c", "ab"), ("c", "a")]  # fmt: skip
    vocab = {t: i for i, t in enumerate(tokens)}
    pruned = bpe_merges.prune_dead_merges(merges, vocab, byte_fallback=False)
    # "abc": (a, b) outranks (b, c), so BPE reaches [ab][c] and never [a][bc].
    # "cab": (a, b) fires first, reaching [c][ab]; [ca][b] is unreachable.
    assert pruned == [("a", "b"), ("b", "c"), ("ab", "c"), ("c", "ab"), ("c", "a")]
    full = Backend(models.BPE(vocab, merges))
    small = Backend(models.BPE(vocab, pruned))
    words = ["abc", "cab", "cabc", "abcab", "bcab", "ccab", "cbca", "aabbcc", "cabcabc"]
    assert [small.encode(w).ids for w in words] == [full.encode(w).ids for w in words]


def test_unsupported_gguf_tokenizer_model_is_a_load_error():
    vocab = gguf_vocab.GGUFVocab("t5", "", "t5", ["a"], None, None, None)
    with pytest.raises(ModelLoadError, match="'t5'"):
        gguf_vocab.build_tokenizer_json(vocab)


SPM_PIECES = ["▁", "t", "h", "e", "a", "c", "s", "▁t", "he", "▁the", "at", "▁c", "▁cat", "▁a",
              "▁s", "at▁", "▁▁", "e▁", "ca", "ch", "▁ch", "the"]  # fmt: skip


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_gguf_sentencepiece_llama_matches_transformers(tmp_path, monkeypatch, arch):
    # A llama-family SentencePiece vocabulary: scores (not positions) rank the recovered merges,
    # byte-fallback tokens, a control and a user-defined token.
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path))
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SPM_PIECES]
    tokens += ["<|turn|>", "<think>"]
    types = [2, 3, 3, *[6] * 256, *[1] * len(SPM_PIECES), 3, 4]
    scores = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))] + [0.0, 0.0]
    scores[tokens.index("▁the")] = -0.5  # out of position order on purpose
    path = tmp_path / "sp.gguf"
    _write_gguf(path, arch, "llama", tokens, types, scores=scores)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    tok = Tokenizer.from_gguf(GGUFFile(path))
    texts = ["the cat", " the cat", "the  cat chase", "thé cät", "", "a<|turn|>b<think>c", "  "]
    for text in texts:
        ids = tok.encode(text)
        assert ids == hf(text)["input_ids"]
        assert ids[:1] == [1]  # SentencePiece vocabularies get BOS unless the file says not
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids)
    assert tok.decode(tok.encode("thé cät")) == "thé cät"
