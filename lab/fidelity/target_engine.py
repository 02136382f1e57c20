"""What a target publishes about its engine's settings, as the lab mocker's engine args.

vLLM's `/metrics` carries its KV cache configuration as the labels of one gauge,
``vllm:cache_config_info`` (block size, number of blocks, prefix caching; only when the server
logs stats, i.e. without ``--disable-log-stats``), and `/v1/models` each model's
``max_model_len``. Its scheduler's settings (``max_num_batched_tokens``, ``max_num_seqs``) are
published nowhere: `lab calibrate` takes them as options and says which it assumed.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

CACHE_CONFIG_GAUGE = "vllm:cache_config_info"
#: engine arg <- its label on CACHE_CONFIG_GAUGE
CACHE_CONFIG_LABELS = {"block_size": "block_size", "num_gpu_blocks": "num_gpu_blocks",
                       "enable_prefix_caching": "enable_prefix_caching"}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
TIMEOUT_S = 5.0


@dataclass
class TargetEngine:
    """Engine args read from a target (`args`), where each came from (`sources`), and the
    model's context length when published."""

    args: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    max_model_len: int | None = None
    added_prompt_tokens: int = 0  # `added_prompt_tokens` below

    def to_dict(self) -> dict[str, Any]:
        return {"args": self.args, "sources": self.sources, "max_model_len": self.max_model_len,
                "added_prompt_tokens": self.added_prompt_tokens}


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def cache_config(metrics_text: str) -> dict[str, Any]:
    """Engine args from the labels of vLLM's cache config gauge in a Prometheus text page."""
    for line in metrics_text.splitlines():
        if not line.startswith(CACHE_CONFIG_GAUGE + "{"):
            continue
        labels = dict(_LABEL.findall(line[len(CACHE_CONFIG_GAUGE) + 1: line.rfind("}")]))
        out: dict[str, Any] = {}
        for arg, label in CACHE_CONFIG_LABELS.items():
            raw = labels.get(label)
            if raw is None or raw in ("", "None"):
                continue
            if arg == "enable_prefix_caching":
                out[arg] = raw.lower() == "true"
            elif raw.isdigit() and int(raw) > 0:
                out[arg] = int(raw)
        return out
    return {}


def model_max_len(models_text: str, model: str) -> int | None:
    try:
        data = json.loads(models_text).get("data", [])
    except (ValueError, AttributeError):
        return None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("max_model_len")
            return value if isinstance(value, int) and value > 0 else None
    return None


def read_target_engine(url: str, model: str) -> TargetEngine:
    """What `url` publishes (nothing, when it publishes nothing: never an error)."""
    base = url.rstrip("/")
    found = TargetEngine()
    metrics = _get(base + "/metrics")
    if metrics:
        found.args = cache_config(metrics)
        found.sources = {k: f"{CACHE_CONFIG_GAUGE} on /metrics" for k in found.args}
    models = _get(base + "/v1/models")
    if models:
        found.max_model_len = model_max_len(models, model)
    return found


def added_prompt_tokens(info: Any, tokenizer: str | None) -> int:
    """Special tokens the target adds to a prompt that the lab's frontend would not: the
    probe's `usage.prompt_tokens` minus its ISL (exact in `tokenizer`), when the tokenizer's
    post-processor adds exactly that many (vLLM's /v1/completions encodes with the BOS; the
    lab's frontend does with --add-special-tokens). 0 otherwise, also when the target reports
    no usage or the workload has no tokenizer."""
    reported, isl = info.probe_prompt_tokens, info.probe_isl
    if tokenizer is None or reported is None or isl is None or reported <= isl:
        return 0
    from lab.shared.hf_tokenizer import load_hf

    tok = load_hf(tokenizer)
    added = (len(tok.encode("a", add_special_tokens=True).ids)
             - len(tok.encode("a", add_special_tokens=False).ids))
    return added if reported - isl == added else 0
