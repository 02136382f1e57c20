"""Synthetic OpenAI request bodies: exactly ISL prompt tokens, exactly OSL output tokens.

Without a tokenizer, prompts are built for the lab frontend's default tokenizer (one token per
whitespace-separated word; `<token:N>` is token N), so the frontend sees exactly `isl` tokens:

- ``prompt_kind="token_ids"``: the prompt is a list of token ids in [1000, 31999];
- ``prompt_kind="words"``: the prompt is a string of `isl` words (`<token:N>` words, so every
  word is one token under the default tokenizer and the ids are the same as the token-id form);
- ``prompt_kind="text"``: natural-looking text (`lab.load.corpus`) of `isl` words: exact in the
  word tokenizer, and close to `isl` tokens on a real one (common words are one or two tokens).

With ``tokenizer`` (a HuggingFace tokenizer.json or model directory), prompts are exact in
*that* tokenizer: ``text`` is corpus text that encodes (``add_special_tokens=False``) to exactly
`isl` tokens, ``token_ids`` the ids of that text (so they are in the model's vocabulary);
``words`` is the lab tokenizer's form and is refused. The shared prefix is `shared_prefix`
tokens of such text, the same for every request of a seed, and ends at a word boundary, so the
requests' own text follows it without changing its tokens.

Output length is pinned with ``max_tokens = min_tokens = osl`` and ``ignore_eos``. Lengths may
vary (normal distribution, clipped to >= 1) with ``isl_stddev`` / ``osl_stddev``. A shared
prefix of ``shared_prefix`` tokens (the same for every request of a run with this seed) gives
prefix-cache hits.

Everything is deterministic for (spec.seed, level_seed, index): the same sweep sends the same bytes.
A request's prompt is drawn from a generator keyed by the seed, the level, the index and the
workload's shape (ISL and OSL, `prompt_key`), so two workloads of one seed that differ in shape
share no prompt text: against a server with a prefix cache, a sweep at ISL 2048 after one at
ISL 512 would otherwise start every prompt with the cached 512 tokens of the other's.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, overload

from lab.load.corpus import exact_text, words_text

TOKEN_ID_MIN = 1000
TOKEN_ID_MAX = 31999
PROMPT_KINDS = ("token_ids", "words", "text")
# the prompt form against a server the lab did not launch (any OpenAI-compatible server takes
# text; many refuse token ids, or ids outside their vocabulary)
TARGET_PROMPT_KIND = "text"
LAB_PROMPT_KIND = "token_ids"  # the launched stack's default (no tokenization in the frontend)
ENDPOINTS = ("completions", "chat")
# nvext fields asked of the frontend: prefill/decode worker ids on the finishing chunk.
NVEXT_EXTRA_FIELDS = ["worker_id"]


@dataclass(frozen=True)
class WorkloadSpec:
    isl: int = 136
    osl: int = 128
    isl_stddev: float = 0.0
    osl_stddev: float = 0.0
    seed: int = 0
    shared_prefix: int = 0
    prompt_kind: str = LAB_PROMPT_KIND  # "token_ids" | "words" | "text"
    stream: bool = True
    endpoint: str = "completions"  # "completions" | "chat" (chat sends text: words or text)
    tokenizer: str | None = None  # a HuggingFace tokenizer.json / model dir: prompts exact in it
    include_usage: bool = True  # ask for usage in streams (stream_options.include_usage)

    def __post_init__(self) -> None:
        if self.isl < 1:
            raise ValueError(f"isl must be >= 1 (got {self.isl})")
        if self.osl < 1:
            raise ValueError(f"osl must be >= 1 (got {self.osl})")
        if self.isl_stddev < 0 or self.osl_stddev < 0:
            raise ValueError("isl_stddev and osl_stddev must be >= 0")
        if self.shared_prefix < 0:
            raise ValueError(f"shared_prefix must be >= 0 (got {self.shared_prefix})")
        if self.prompt_kind not in PROMPT_KINDS:
            raise ValueError(
                f"prompt_kind must be one of {PROMPT_KINDS} (got {self.prompt_kind!r})")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS} (got {self.endpoint!r})")
        if self.tokenizer is not None and self.prompt_kind == "words":
            raise ValueError("prompt_kind 'words' is the lab word tokenizer's <token:N> form; "
                             "with a tokenizer use 'text' or 'token_ids'")

    def to_dict(self) -> dict:
        return asdict(self)


def endpoint_path(spec: WorkloadSpec) -> str:
    return "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"


def _length(rng: random.Random, mean: int, stddev: float) -> int:
    if stddev <= 0:
        return mean
    return max(1, round(rng.gauss(mean, stddev)))


def _shared_prefix_ids(spec: WorkloadSpec) -> list[int]:
    rng = random.Random(f"prefix/{spec.seed}")
    return [rng.randint(TOKEN_ID_MIN, TOKEN_ID_MAX) for _ in range(spec.shared_prefix)]


def prompt_key(spec: WorkloadSpec, level_seed: int, index: int) -> str:
    """The seed of request `index`'s prompt generator (module doc: why the shape is in it)."""
    return f"req/{spec.seed}/{spec.isl}/{spec.osl}/{level_seed}/{index}"


def prompt_ids(spec: WorkloadSpec, level_seed: int, index: int,
               prefix: list[int] | None = None) -> list[int]:
    """The prompt token ids of request `index` (length isl, or drawn around it)."""
    rng = random.Random(prompt_key(spec, level_seed, index))
    isl = _length(rng, spec.isl, spec.isl_stddev)
    if prefix is None:
        prefix = _shared_prefix_ids(spec)
    head = prefix[:isl]
    return head + [rng.randint(TOKEN_ID_MIN, TOKEN_ID_MAX) for _ in range(isl - len(head))]


def output_len(spec: WorkloadSpec, level_seed: int, index: int) -> int:
    rng = random.Random(f"osl/{spec.seed}/{level_seed}/{index}")
    return _length(rng, spec.osl, spec.osl_stddev)


def ids_to_words(ids: list[int]) -> str:
    """Word form of token ids for the default tokenizer: one `<token:N>` word per token."""
    return " ".join(f"<token:{i}>" for i in ids)


class Prompts:
    """The prompts of one workload: `prompt(level_seed, index)` -> (prompt, isl).

    Loads the tokenizer (once per process) and builds the shared prefix on first use; pickles
    without them (a spawned client process rebuilds them)."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self._tok: Any = None
        self._prefix: Any = None

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "_tok": None, "_prefix": None}

    @property
    def tokenizer(self) -> Any:
        if self._tok is None and self.spec.tokenizer is not None:
            from lab.shared.hf_tokenizer import load_hf

            self._tok = load_hf(self.spec.tokenizer)
        return self._tok

    def prefix(self) -> Any:
        """Prefix ids (no tokenizer), or the prefix text (with a tokenizer or text prompts)."""
        if self._prefix is None:
            spec = self.spec
            if spec.tokenizer is None and spec.prompt_kind != "text":
                self._prefix = _shared_prefix_ids(spec)
            elif spec.shared_prefix == 0:
                self._prefix = ""
            else:
                rng = random.Random(f"prefix-text/{spec.seed}")
                if spec.tokenizer is None:
                    self._prefix = words_text(rng, spec.shared_prefix)
                else:
                    self._prefix = exact_text(self.tokenizer, spec.shared_prefix, rng)
        return self._prefix

    def prompt(self, level_seed: int, index: int) -> tuple[str | list[int], int]:
        spec = self.spec
        prefix = self.prefix()
        if spec.tokenizer is None and spec.prompt_kind != "text":
            ids = prompt_ids(spec, level_seed, index, prefix)
            return (ids if spec.prompt_kind == "token_ids" and spec.endpoint != "chat"
                    else ids_to_words(ids)), len(ids)
        rng = random.Random(prompt_key(spec, level_seed, index))
        isl = _length(rng, spec.isl, spec.isl_stddev)
        if spec.tokenizer is None:
            head = prefix.split()[:isl]
            rest = words_text(rng, isl - len(head)) if isl > len(head) else ""
            return " ".join([*head, rest] if rest else head), isl
        tok = self.tokenizer
        if isl <= spec.shared_prefix:
            # the prefix's own first `isl` tokens: the same text generator, cut shorter
            text = exact_text(tok, isl, random.Random(f"prefix-text/{spec.seed}"))
        else:
            text = exact_text(tok, isl, rng, head=prefix)
        if spec.prompt_kind == "token_ids" and spec.endpoint != "chat":
            return tok.encode_batch_fast([text], add_special_tokens=False)[0].ids, isl
        return text, isl


def build_body(spec: WorkloadSpec, model: str, level_seed: int, index: int,
               prefix: list[int] | None = None, prompts: Prompts | None = None) -> dict:
    """One OpenAI request body (deterministic)."""
    if prompts is None:
        prompts = Prompts(spec)
        if prefix is not None:
            prompts._prefix = prefix
    prompt, _ = prompts.prompt(level_seed, index)
    return request_body(model, spec.endpoint, prompt, output_len(spec, level_seed, index),
                        stream=spec.stream, include_usage=spec.include_usage)


def request_body(model: str, endpoint: str, prompt: str | list[int], osl: int, *, stream: bool,
                 include_usage: bool) -> dict:
    """The OpenAI body every generated request shares (synthetic and trace alike): the prompt
    (chat: one user message), exactly `osl` output tokens (`max_tokens = min_tokens`,
    `ignore_eos`), the nvext fields asked of the frontend, and usage in the stream."""
    body: dict = {"model": model}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(
        max_tokens=osl,
        min_tokens=osl,
        ignore_eos=True,
        stream=stream,
        nvext={"extra_fields": list(NVEXT_EXTRA_FIELDS)},
    )
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


class LazyRequests(Sequence[dict]):
    """Request bodies built on access (picklable; a timed level draws from 10**9 of them at no
    cost): a subclass gives `__len__`, `body(i)` and `requested(i)`."""

    def body(self, i: int) -> dict:
        raise NotImplementedError

    def requested(self, i: int) -> tuple[int, int]:
        """(prompt tokens, output tokens) requested by body `i`."""
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> dict: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict]: ...
    def __getitem__(self, i: int | slice) -> dict | list[dict]:
        n = len(self)
        if isinstance(i, slice):
            return [self.body(j) for j in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self.body(i)

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self.body(i)


class RequestSet(LazyRequests):
    """A lazy, deterministic sequence of the workload's request bodies (for long or timed
    levels): `RequestSet(spec, model, level_seed, 10**9)` costs nothing until drawn from."""

    def __init__(self, spec: WorkloadSpec, model: str, level_seed: int, n: int) -> None:
        self.spec = spec
        self.model = model
        self.level_seed = level_seed
        self.n = n
        self.prompts = Prompts(spec)

    def __len__(self) -> int:
        return self.n

    def body(self, i: int) -> dict:
        return build_body(self.spec, self.model, self.level_seed, i, prompts=self.prompts)

    def requested(self, i: int) -> tuple[int, int]:
        """(prompt tokens, output tokens) requested by body `i`, in the workload's tokenizer."""
        rng = random.Random(prompt_key(self.spec, self.level_seed, i))
        return (_length(rng, self.spec.isl, self.spec.isl_stddev),
                output_len(self.spec, self.level_seed, i))


def build_requests(spec: WorkloadSpec, model: str, n: int, level_seed: int) -> list[dict]:
    """`n` OpenAI request bodies for one level, deterministic for (spec.seed, level_seed)."""
    return list(RequestSet(spec, model, level_seed, n))
