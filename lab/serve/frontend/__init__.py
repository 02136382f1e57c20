"""The OpenAI-compatible frontend (`lab frontend`): HTTP in, request plane out.

Modules: `config` (settings and defaults), `errors` (OpenAI error bodies), `protocol` (request
parsing and validation), `encode` (response bodies and SSE events), `workers` (discovery ->
request-plane clients), `dispatch` (aggregated / disaggregated orchestration, migration),
`metrics` (Prometheus text), `app` (aiohttp handlers), `server` (process lifecycle), `cli`.
"""
