"""mocker.server: the gRPC edge of the mocker (openengine.v1 as the TensorRT-LLM OpenEngine mock
serves it; docs/mocker.md).

Modules, one job each:

* `app`         - assemble the grpc.aio server, run it, graceful stop (SIGTERM/SIGINT).
* `config`      - what the server runs on (`ServerConfig`: its settings, the engine args they
                  name) and the wire server's constants; engine defaults: mocker.engine.config.
* `validation`  - request preparation: every pre-acceptance check, as gRPC statuses, in order.
* `handoff`     - the prefill stamp and the decode leg's strict KvSessionRef validation.
* `engine_loop` - the asyncio task that owns the Scheduler, paced by absolute deadlines; when
                  behind schedule it runs the overdue passes in one loop turn (delivery rule
                  in its docstring), so streams send many tokens per message.
* `inflight`    - per-request state, the single abort claim and the `Exit` enum.
* `inference`   - Generate: streaming, coalescing, and the one terminal event.
* `fastwire`    - hand-encoded token events for the hot path.
* `tokens_out`  - token text, synthetic logprobs and candidates.
* `control`     - Control RPCs (identity, model, load, health, abort; refused LoRA/KV events).
* `health`      - grpc.health.v1 whose Watch streams end on graceful stop.
* `admin`       - loadlab.mocker.v1.Admin fault injection.
* `recorder`    - the request recorder (`--record-requests`; read it over gRPC at
                  `/loadlab.mocker.v1.Recorder/List`, client helper `recorder.list_recorded`).
* `state`       - shared state: registries, permits, fault switches, the stall watchdog scan.
"""
