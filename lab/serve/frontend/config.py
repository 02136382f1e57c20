"""The frontend's own constants (its settings: `lab.shared.frontend_settings.FrontendSettings`)."""

from __future__ import annotations

# /v1/completions without max_tokens: the OpenAI default (chat leaves it to the sidecar, which
# derives it from the context window).
DEFAULT_COMPLETIONS_MAX_TOKENS = 16
# A worker whose request-plane connection failed is skipped for this long (it may be restarting
# or about to expire from discovery).
WORKER_BACKOFF_S = 1.0
#: The frontend's id in its ready line.
FRONTEND_ID = "frontend"
