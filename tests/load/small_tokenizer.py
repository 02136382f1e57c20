"""A small real HuggingFace tokenizer for tests: a byte-level BPE trained with `tokenizers` on a
few KB of text written for these tests (so words split into several tokens, as a real model's
tokenizer splits the lab's `<token:N>` words)."""

from __future__ import annotations

from pathlib import Path

VOCAB_SIZE = 400
SPECIAL = ["<s>", "</s>"]

# A few KB of plain prose written for the tests (no licence question).
_TEXT = """
A load test asks a simple question: how much work can a server do before it gets slow? The
answer depends on the prompts it is given, on how long the answers are, and on how many requests
are in flight at the same time. A careful tester writes down each of these choices, because a
number without its workload means very little. Two servers that look equal at one request in
flight can differ by a factor of ten when sixty four requests arrive together.

The tokenizer decides how long a prompt really is. People count words, but models count tokens,
and a token can be a whole word, a part of a word, a single letter or even a piece of a letter.
Common words are often one token each. Rare words, names and numbers break into several pieces.
When a benchmark promises prompts of one hundred and thirty six tokens, it has to build them with
the tokenizer of the model it measures, or the server will count something else entirely.

Streaming changes what a user feels. The first token arrives after the prompt is processed, and
the rest follow one by one. Time to first token is what makes an interface feel quick or slow;
the time between tokens decides whether text flows or stutters. A server that batches many
requests together may raise both, and a good report shows the trade: more requests per second,
paid for with longer waits.

Networks add their own small delays. A message written in two parts may wait for an
acknowledgement that the other side holds back on purpose, hoping to send it together with an
answer. Each side waits for the other, and forty milliseconds pass before a timer breaks the
silence. Such stalls hide at low load, where nothing else moves on the connection, and vanish
when traffic is heavy. They are easy to miss and hard to explain without an experiment.

A reproducible experiment fixes its random seed, records the versions of every program, and
keeps the raw measurements, not only the averages. Anyone can then rebuild the tables and the
plots from the same files, check the arithmetic, and ask a different question of the same data.
The machine matters as well: the number of cores, the kernel, and whatever else was running at
the time. On a shared machine, every figure is stretched a little, and honest reports say so.

Errors are data too. A request that fails must still be counted, with the reason it failed, so
that a high throughput never hides a high error rate. When every request fails, the report
should say exactly that, name the error the server returned, and suggest what to change, rather
than printing a table full of empty cells or stopping with a long trace of program internals.
"""


def make_tokenizer(directory: Path, bos: bool = False) -> Path:
    """Train the tokenizer into DIRECTORY/tokenizer.json (deterministic); returns DIRECTORY.
    With `bos`, its post-processor puts "<s>" before a text encoded with special tokens, as a
    Llama tokenizer's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_TEXT.split("\n"), trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory
