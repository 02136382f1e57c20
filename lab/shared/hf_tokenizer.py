"""Load a HuggingFace tokenizer from a local path (no hub access): one loader for the workload
(prompts of exactly ISL tokens) and the frontend (`--tokenizer`), so both read the same file the
same way.

PATH is a `tokenizer.json` or a directory holding one (a local model directory). Encoding
throughout the lab uses ``add_special_tokens=False``: the prompt's own tokens, without a BOS or
other post-processor tokens. That is how Dynamo's /v1/completions counts a text prompt; a server
that adds a BOS token reports one more prompt token (0.7% of 136).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"


class TokenizerFileError(ValueError):
    """A --tokenizer PATH that does not name a loadable tokenizer.json (message names PATH)."""


def tokenizer_json(path: str | Path) -> Path:
    """The tokenizer.json that PATH names (the file, or the one inside the directory)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / TOKENIZER_FILE
    if not p.is_file():
        raise TokenizerFileError(f"{path}: no {TOKENIZER_FILE} found (give a tokenizer.json "
                                 "or a local model directory holding one)")
    return p.resolve()


_CACHE: dict[Path, Any] = {}


def load_hf(path: str | Path) -> Any:
    """The `tokenizers.Tokenizer` at PATH (cached per process); TokenizerFileError otherwise."""
    p = tokenizer_json(path)
    tok = _CACHE.get(p)
    if tok is not None:
        return tok
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as exc:  # tokenizers raises its own Exception subclass for a bad file
        raise TokenizerFileError(f"{path}: cannot load {p.name}: {exc}") from None
    _CACHE[p] = tok
    return tok
