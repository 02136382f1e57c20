"""Constants of the wire contracts: each is defined here once and imported everywhere else."""

from __future__ import annotations

from typing import Final

# --- Token delivery ----------------------------------------------------------------------------
# Tokens per TokenOutput message: 1 = every engine step is its own message (vLLM
# `--stream-interval`, TensorRT-LLM `stream_interval`); N > 1 = every N tokens, plus the last.
DEFAULT_STREAM_INTERVAL: Final = 1
# The largest interval: one TokenOutput of this many tokens with 20 logprob candidates each
# (~1 KB per token) stays far below the 64 MiB gRPC message limit.
MAX_STREAM_INTERVAL: Final = 4096

# --- GenerateRequest.extra keys (docs/engine-contract.md "Phase selection") -------------------
# A prefill (context) leg carries extra.request_type = "context_only"; the Dynamo TRT-LLM
# sidecar always sends extra.detokenize = false (token-only output).
REQUEST_TYPE_KEY: Final = "request_type"
CONTEXT_ONLY: Final = "context_only"
DETOKENIZE_KEY: Final = "detokenize"

# --- Handoff JSON between the legs (docs/engine-contract.md "Handoff between legs") -----------
# `disaggregated_params` mirrors KvSessionRef; all five keys are required on the decode leg
# (`attributes` is KvSessionRef.attributes_struct as JSON).
HANDOFF_SESSION_ID: Final = "session_id"
HANDOFF_TRANSFER_BACKEND: Final = "transfer_backend"
HANDOFF_ENDPOINTS: Final = "endpoints"
HANDOFF_DP_RANK: Final = "dp_rank"
HANDOFF_ATTRIBUTES: Final = "attributes"
HANDOFF_KEYS: Final = (HANDOFF_SESSION_ID, HANDOFF_TRANSFER_BACKEND, HANDOFF_ENDPOINTS,
                       HANDOFF_DP_RANK, HANDOFF_ATTRIBUTES)

# --- The mocker's handoff stamps (docs/mocker.md "Handoff stamps and their validation") ------
# Prefill stamps session_id = MOCKER_SESSION_PREFIX + uuid, transfer_backend "MOCKER", one
# endpoint with protocol "mocker", dp_rank 0, and four typed attributes chosen to catch lossy
# relays: a string, a whole-valued double, the fractional double 12.5 (must survive exactly),
# and a one-element list; plus the optional logprob list when output logprobs were asked for.
MOCKER_SESSION_PREFIX: Final = "mocker-prefill-"
MOCKER_TRANSFER_BACKEND: Final = "MOCKER"
MOCKER_KV_PROTOCOL: Final = "mocker"
#: The mocker's GetLoad attribute: Generate streams it has registered and not released yet.
OPEN_STREAMS_ATTRIBUTE: Final = "open_streams"
MOCKER_DP_RANK: Final = 0
ATTR_REQUEST_ID: Final = "mocker_request_id"  # string
ATTR_PROMPT_TOKENS: Final = "mocker_prompt_tokens"  # whole-valued double
ATTR_TTFT_MS: Final = "mocker_ttft_ms"  # exactly MOCKER_TTFT_MS
ATTR_FIRST_GEN_TOKENS: Final = "mocker_first_gen_tokens"  # [token id]
ATTR_FIRST_GEN_LOG_PROBS: Final = "mocker_first_gen_log_probs"  # optional [finite logprob]
MOCKER_TTFT_MS: Final = 12.5
MOCKER_REQUIRED_ATTRIBUTES: Final = (ATTR_REQUEST_ID, ATTR_PROMPT_TOKENS, ATTR_TTFT_MS,
                                     ATTR_FIRST_GEN_TOKENS)

# --- grpc.health.v1 service names the mocker serves ----------------------------------------
# (docs/engine-contract.md "Health service names")
HEALTH_OVERALL: Final = ""
HEALTH_LIVENESS: Final = "liveness"
HEALTH_INFERENCE: Final = "inference"
INFERENCE_SERVICE: Final = "openengine.v1.Inference"
CONTROL_SERVICE: Final = "openengine.v1.Control"
ADMIN_SERVICE: Final = "loadlab.mocker.v1.Admin"
HEALTH_SERVICES: Final = (HEALTH_OVERALL, HEALTH_LIVENESS, HEALTH_INFERENCE, INFERENCE_SERVICE,
                          CONTROL_SERVICE)


# -- deployment-wide values shared by the engine and the serving path --------------------------

#: The model name the mocker reports and the lab's topologies serve by default.
DEFAULT_MODEL = "mocker-model"
#: Worker roles (engine disaggregation modes, discovery record roles).
ROLES = ("aggregated", "prefill", "decode")
#: Largest gRPC message either side of the engine contract accepts (the real servicer's 64 MiB).
MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
