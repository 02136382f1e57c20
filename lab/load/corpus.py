"""Natural-looking prompt text: a deterministic sentence generator, and prompts of exactly N
tokens in a HuggingFace tokenizer.

The corpus is made here, not shipped: sentences of common English words (the list below, written
for this project, so no licence question arises), drawn with a seeded `random.Random`. Real
tokenizers split such text the way they split ordinary prose (mostly one or two tokens a word),
unlike the lab's `<token:N>` words, which a BPE tokenizer cuts into about 11 pieces each. The
text means nothing; for load it does not need to, and a generator gives any length for any seed
without a data file.

`exact_text(tokenizer, n, rng)` returns text that encodes (``add_special_tokens=False``) to
exactly `n` tokens: it generates a little more text than needed, cuts it at the end of token n,
and checks the cut by encoding it again (a cut inside a word can merge differently; then the
nearest cut that encodes to exactly n tokens is taken). Text appended after a cut starts with a
space, so a tokenizer that splits words before merging (byte-level BPE, Metaspace) keeps the
tokens of the cut text: a shared prefix stays the same tokens in every request.
"""

from __future__ import annotations

import random
from typing import Any

_WORD_TEXT = """
the a of and to in is was that for on with as by at from it this be are or have has had not
but which one all were when there can an their more would will been if so what out up about
into than them only time other some could these two may first then do any like my now over
such our man me even most made after also did many before must through back years where much
your way well down should because each just those people how too little state good very make
world still own see men work long get here between both life being under never day same
another know while last might us great old year off come since against go came right used take
three house hand morning river garden window letter bridge market winter summer evening road
city village mountain forest island harbour station kitchen table chair door wall field
stone water light fire wind rain snow cloud sun moon star tree flower bird horse dog cat
friend brother sister mother father child teacher doctor farmer sailor writer painter
question answer story number colour sound voice music picture paper book page word name idea
reason problem system market price value order power money family school company country
quiet bright dark warm cold early late quick slow gentle heavy small large young ancient
green blue red yellow white black silver golden narrow wide deep simple careful strange
walk walked walks run ran carry carried open opened close closed follow followed remember
remembered answer answered travel travelled build built write wrote read listen listened
watch watched wait waited believe believed decide decided explain explained gather gathered
across along around behind beyond during without within toward among beneath above below
slowly quickly often always sometimes almost perhaps together already again soon later
"""
_WORDS: list[str] = _WORD_TEXT.split()


def sentences(rng: random.Random) -> Any:
    """An endless stream of words forming sentences of 6-18 words (capitalised, with commas and
    full stops), deterministic for the state of `rng`."""
    words = _WORDS
    while True:
        n = rng.randint(6, 18)
        comma = rng.randint(3, n - 2) if n > 8 and rng.random() < 0.5 else -1
        for i in range(n):
            w = words[rng.randrange(len(words))]
            if i == 0:
                w = w.capitalize()
            if i == comma:
                w += ","
            if i == n - 1:
                w += "." if rng.random() < 0.85 else "?"
            yield w


def words_text(rng: random.Random, n: int) -> str:
    """`n` corpus words joined by single spaces (exactly n tokens in the lab's word tokenizer)."""
    gen = sentences(rng)
    return " ".join(next(gen) for _ in range(n))


def count_tokens(tokenizer: Any, text: str) -> int:
    # `encode_batch_fast` of one text: the same ids as `encode`, without the offsets (4096
    # tokens: 3.3 ms against 4.7, tokenizers 0.23)
    return len(tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids)


class ExactTextError(RuntimeError):
    pass


def exact_text(tokenizer: Any, n: int, rng: random.Random, head: str = "") -> str:
    """Text starting with `head` that encodes to exactly `n` tokens (n >= tokens of head)."""
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    gen = sentences(rng)
    for attempt in range(ATTEMPTS):
        if attempt:
            # no cut of this text works (e.g. a Metaspace tokenizer's lone "▁" token at
            # n=1): try text that starts elsewhere in the stream, lower-case on odd attempts
            for _ in range(rng.randint(1, 7)):
                next(gen)
        cut = _exact_cut(tokenizer, n, gen, head, lower=attempt % 2 == 1)
        if cut is not None:
            return cut
    raise ExactTextError(f"no text of the corpus encodes to exactly {n} tokens in this "
                         "tokenizer")


ATTEMPTS = 32


def _exact_cut(tokenizer: Any, n: int, gen: Any, head: str, lower: bool) -> str | None:
    text = head
    margin = 8
    while True:
        # `encode_batch` of one text is `encode` that lets go of the GIL while it runs, so
        # prompts built on two threads encode in parallel (lab/load/client.py, the prebuild)
        enc = tokenizer.encode_batch([text], add_special_tokens=False)[0]
        have = len(enc.ids)
        if have >= n + margin:
            break
        more = " ".join(next(gen) for _ in range(max(4, n + margin - have)))
        if lower:
            more = more.lower()
        text = f"{text} {more}" if text else more
    # the end of token n is the cut, unless cutting there re-tokenizes the last word into more
    # or fewer pieces; then the nearest cut that encodes to exactly n tokens. (`token_to_chars`
    # reads one token's span; `enc.offsets` would build all of them, 0.6 ms at 5,000 tokens.)
    for k in sorted(range(max(1, n - margin), min(have, n + margin) + 1),
                    key=lambda k: abs(k - n)):
        span = enc.token_to_chars(k - 1)
        end = span[1] if span is not None else 0
        if end < len(head) or end == 0:
            continue
        cut = text[:end]
        if count_tokens(tokenizer, cut) == n:
            return cut
    return None
