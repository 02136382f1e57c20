"""The one check of a server the lab did not launch (`--target URL`), before the first level of
`lab sweep` and the first arm of `lab nagle`.

1. The URL is an http(s) URL.
2. `GET /v1/models`: where the server has it, the model must be listed (and without --model, a
   server listing exactly one model gives it). A server without it (any non-200) is fine: the
   probe request then tells whether the model exists.
3. One probe request, built by the workload exactly as the measured requests are (prompt form,
   endpoint, model), but with a few output tokens, streaming, with
   `stream_options.include_usage`. It must stream content events. A 400/422 is retried once
   without `stream_options` (some servers reject the field); if that works, the run asks for no
   usage and output tokens are counted from the events. A stream without usage is noted too.

A failure raises TargetError: one message naming the server's status and its error text, and
`option`, the command-line option to change.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace

from lab.load.client import run_level
from lab.load.client_settings import ClientSettings
from lab.load.record import RequestRecord
from lab.load.workload import RequestSet, WorkloadSpec, endpoint_path

PROBE_OUTPUT_TOKENS = 4
PROBE_LEVEL_SEED = 0
DEFAULT_TIMEOUT_S = 30.0
NOT_STREAMING = ("the server does not stream this request (the lab measures TTFT from streamed "
                 "events)")
_URL_RE = re.compile(r"^https?://[^/\s]+")


class TargetError(Exception):
    """The target cannot be used as configured; `option` is the option to change."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.message = message
        self.option = option


@dataclass
class TargetInfo:
    url: str
    model: str
    models: list[str] | None  # what /v1/models listed; None: the server has no usable list
    include_usage: bool  # the server accepts stream_options.include_usage
    usage_in_stream: bool  # its stream carried usage (else output tokens = content events)
    probe_prompt_tokens: int | None  # usage.prompt_tokens of the probe, when reported
    probe_isl: int | None  # the probe's prompt tokens, as the workload built them
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def check_url(url: str) -> str:
    if not _URL_RE.match(url):
        raise TargetError(f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000",
                          "--target")
    return url.rstrip("/")


async def served_models(url: str, timeout_s: float) -> tuple[int, list[str] | None]:
    """(HTTP status of /v1/models, the model ids it lists or None); TargetError when the server
    cannot be reached at all."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (aiohttp.ClientSession(timeout=timeout) as session,
                    session.get(url + "/v1/models") as resp):
            if resp.status != 200:
                return resp.status, None
            try:
                data = await resp.json(content_type=None)
                ids = [str(m["id"]) for m in data["data"] if isinstance(m, dict) and "id" in m]
            except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
                return resp.status, None
            return resp.status, ids
    except TimeoutError:  # aiohttp's carries no text: say what waited, how long, and the knob
        raise TargetError(f"GET {url}/v1/models got no answer within {timeout_s:g} s (the "
                          f"check waits --timeout, at most {DEFAULT_TIMEOUT_S:g} s)",
                          "--timeout") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise TargetError(f"cannot reach {url}: {type(exc).__name__}: {exc or '(no detail)'}",
                          "--target") from None


# The output-length fields every request carries (lab.load.workload.build_body).
SENT_LENGTH_FIELDS = "max_tokens = min_tokens = the OSL, ignore_eos true"


def _advice(status: int, text: str, spec: WorkloadSpec, path: str) -> tuple[str, str]:
    """(what to try, the option) for an HTTP error answer to the probe."""
    low = text.lower()
    if status == 404 and "model" in low:
        return "name a model the server serves", "--model"
    if status in (404, 405):
        other = "completions" if spec.endpoint == "chat" else "chat"
        return f"the server has no {path}: try --endpoint {other}", "--endpoint"
    if status in (400, 422):
        if spec.endpoint != "chat" and spec.prompt_kind == "token_ids":
            return ("token-id prompts are refused (or outside the model's vocabulary): use "
                    "--prompt-kind text (with --tokenizer for exact lengths)"), "--prompt-kind"
        if spec.endpoint != "chat" and spec.prompt_kind == "words":
            return "try --prompt-kind text", "--prompt-kind"
        # No endpoint guess: a server that refuses a field (e.g. min_tokens on a prefill leg)
        # refuses it on both endpoints, so the server's own text is the advice.
        return (f"the server refused the request as sent ({SENT_LENGTH_FIELDS}); its answer "
                "above (and its log) says which part"), "--target"
    if status in (401, 403):
        return "the server wants credentials the lab does not send", "--target"
    return "the server failed the request", "--target"


async def check_target(url: str, model: str | None, spec: WorkloadSpec, *,
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> TargetInfo:
    """Check `url` serves `model` and streams the workload's requests; see the module doc."""
    url = check_url(url)
    status, models = await served_models(url, timeout_s)
    notes: list[str] = []
    if models is not None:
        if model is None:
            if len(models) != 1:
                raise TargetError(f"{url} serves {len(models)} models "
                                  f"({', '.join(models) or 'none'}): choose one", "--model")
            model = models[0]
        elif model not in models:
            raise TargetError(f"{url} does not serve model {model!r} (it serves: "
                              f"{', '.join(models) or 'none'})", "--model")
    else:
        notes.append(f"/v1/models answered HTTP {status} without a model list: the probe "
                     "request checked the model")
        if model is None:
            raise TargetError(f"{url}/v1/models answered HTTP {status} without a model list, "
                              "so the model cannot be chosen for you: name it", "--model")

    probe = replace(spec, stream=True, osl=PROBE_OUTPUT_TOKENS, osl_stddev=0.0)
    include_usage = spec.include_usage
    rec = await _probe(url, model, probe, timeout_s)
    path = endpoint_path(spec)
    if (not rec.ok and include_usage and rec.http_status in (400, 422)):
        retry = await _probe(url, model, replace(probe, include_usage=False), timeout_s)
        if retry.ok:
            include_usage = False
            notes.append(f"the server refused stream_options.include_usage (HTTP "
                         f"{rec.http_status}: {rec.error_message}): no usage is "
                         "asked for; output tokens are counted from the stream's events")
        rec = retry
    if not rec.ok:
        http = rec.http_status
        kind, msg = rec.error_kind, rec.error_message or ""
        what = f"the probe request ({_describe(spec)}) to {url}{path}"
        if kind in ("connect", "timeout") or http is None:
            option = "--timeout" if kind == "timeout" else "--target"
            raise TargetError(f"{what} failed: {kind}: {msg}", option)
        if http != 200:
            advice, option = _advice(http, msg, spec, path)
            raise TargetError(f"{what} got HTTP {http}: {msg or '(no error text)'}; {advice}",
                              option)
        if kind == "incomplete" and not rec.chunks:
            raise TargetError(f"{what} got HTTP 200 but no SSE events: {NOT_STREAMING}",
                              "--target")
        raise TargetError(f"{what}: the stream failed ({kind}: {msg}); the lab needs a server "
                          "that streams (SSE)", "--target")
    if not rec.chunks:
        raise TargetError(f"the probe request ({_describe(spec)}) to {url}{path} got HTTP 200 "
                          f"but no content events: {NOT_STREAMING}", "--target")
    usage_in_stream = rec.output_tokens_source == "usage"
    if include_usage and not usage_in_stream:
        notes.append("the stream carried no usage: output tokens are counted from its events, "
                     "and the server's prompt tokens are unknown")
    return TargetInfo(
        url=url, model=model, models=models, include_usage=include_usage,
        usage_in_stream=usage_in_stream,
        probe_prompt_tokens=rec.input_tokens if usage_in_stream else None,
        probe_isl=rec.isl_requested, notes=notes)


def _describe(spec: WorkloadSpec) -> str:
    kind = "messages" if spec.endpoint == "chat" else f"{spec.prompt_kind} prompt"
    return f"{kind}, --endpoint {spec.endpoint}"


async def _probe(url: str, model: str, spec: WorkloadSpec, timeout_s: float) -> RequestRecord:
    bodies = RequestSet(spec, model, PROBE_LEVEL_SEED, 1)
    res = await run_level(url, bodies, 1, options=ClientSettings(
        timeout=timeout_s, in_process_client=True, request_id_prefix="lab-probe-"))
    return res.records[0]

