"""The ids the engine may emit, from `--tokenizer PATH` or `--vocab-size N` (docs/mocker.md
"Tokens"): the server reads the tokenizer file and hands the pure engine the table.

A tokenizer's vocabulary is every id it knows (added tokens included) but its special added
tokens (BOS, EOS, `<|eot_id|>`, pad, ...): a real engine samples from the model's vocabulary and
a special token only ends a request, which the mocker does by its stop-token handling instead.
Also left out: ids that decode on their own to no text or to text with U+FFFD (a byte-level
piece of a UTF-8 character). A model emits those only in runs that complete a character; ids
drawn independently would not, so every emitted token is one whole piece of text, and a stream
of N tokens is N text deltas at a streaming detokenizer (Dynamo's, vLLM's, the lab frontend's).
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.shared.hf_tokenizer import TokenizerFileError, load_hf
from mocker.engine import DEFAULT_ALLOWED_IDS, allowed_token_ids


def tokenizer_allowed_ids(path: str) -> tuple[int, ...]:
    """The emitted-id table of the HuggingFace tokenizer at PATH (ValueError naming PATH)."""
    try:
        tok = load_hf(path)
    except TokenizerFileError as exc:
        raise ValueError(str(exc)) from None
    size = tok.get_vocab_size(with_added_tokens=True)
    special = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
    holes = {i for i in range(size) if tok.id_to_token(i) is None}
    texts = tok.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    partial = {i for i, text in enumerate(texts) if not text or "\ufffd" in text}
    try:
        return allowed_token_ids(size, special | holes | partial)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def allowed_ids(tokenizer: str, vocab_size: int) -> Sequence[int]:
    """The table for a server's `tokenizer` / `vocab_size` settings (empty / 0 = not given;
    neither = the default ids [1000, 31999])."""
    if tokenizer and vocab_size:
        raise ValueError("give --tokenizer or --vocab-size, not both")
    if tokenizer:
        return tokenizer_allowed_ids(tokenizer)
    if vocab_size:
        return allowed_token_ids(vocab_size)
    return DEFAULT_ALLOWED_IDS
