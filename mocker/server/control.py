"""openengine.v1 Control: identity, model info, load, health, abort; LoRA and KV-event RPCs are
refused exactly like the TensorRT-LLM OpenEngine server refuses them."""

from __future__ import annotations

import time
from importlib import metadata

import grpc

from lab.shared.reasoning import REASONING_PARSERS
from lab.wire import constants as wc
from lab.wire.constants import OPEN_STREAMS_ATTRIBUTE

from .config import (
    ENGINE_NAME,
    KV_SCHEMA_VERSION,
    MAX_OUTPUT_TOKENS,
    MAX_TOP_N,
    MINIMUM_CLIENT_REVISION,
    SCHEMA_REVISION,
)
from .errors import not_implemented
from .pb import kv_pb2, lifecycle_pb2, model_pb2, openengine_pb2_grpc, server_pb2
from .state import ServerState

_ROLES = {
    "aggregated": server_pb2.ENGINE_ROLE_AGGREGATED,
    "prefill": server_pb2.ENGINE_ROLE_PREFILL,
    "decode": server_pb2.ENGINE_ROLE_DECODE,
}
_CANDIDATE_MODES = [
    model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N,
    model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS,
    model_pb2.CANDIDATE_TOKEN_SELECTION_MODE_ALL,
]
READY = lifecycle_pb2.HEALTH_STATE_READY
NOT_READY = lifecycle_pb2.HEALTH_STATE_NOT_READY


def engine_version() -> str:
    try:
        return metadata.version("loadlab")
    except metadata.PackageNotFoundError:  # pragma: no cover - source checkout without install
        return "0.0.0"


class Control(openengine_pb2_grpc.ControlServicer):
    def __init__(self, state: ServerState) -> None:
        self._st = state
        self._version = engine_version()

    async def _refuse(self, context, rpc: str):
        refused = not_implemented(rpc)
        await context.abort(refused.code, refused.message)

    async def GetServerInfo(self, request, context):
        cfg = self._st.cfg
        args = cfg.engine
        return server_pb2.ServerInfo(
            engine_name=ENGINE_NAME,
            engine_version=self._version,
            engine_role=_ROLES[cfg.settings.role],
            instance_id=cfg.instance_id,
            supported_models=[cfg.settings.model],
            parallelism=server_pb2.ParallelismInfo(
                tensor_parallel_size=1,
                pipeline_parallel_size=1,
                data_parallel_size=1,
                data_parallel_rank=0,
                data_parallel_start_rank=0,
                decode_context_parallel_size=1,
            ),
            kv_connector=kv_pb2.KvConnectorInfo(
                enabled=cfg.settings.role != "aggregated",
                transfer_backend=wc.MOCKER_TRANSFER_BACKEND,
                local_endpoints=[
                    kv_pb2.KvEndpoint(
                        host=cfg.settings.kv_host,
                        port=cfg.settings.kv_port,
                        protocol=wc.MOCKER_KV_PROTOCOL,
                    )
                ],
                supported_protocols=[wc.MOCKER_KV_PROTOCOL],
                supports_remote_prefill=True,
                supports_decode_pull=False,
                supports_abort_cleanup=False,
                schema_version=KV_SCHEMA_VERSION,
            ),
            schema_revision=SCHEMA_REVISION,
            minimum_client_revision=MINIMUM_CLIENT_REVISION,
            capacity=server_pb2.DeploymentCapacity(
                kv_block_size=args.block_size,
                total_kv_blocks=args.num_gpu_blocks,
                max_running_requests=args.max_num_seqs,
                max_batched_tokens=args.max_num_batched_tokens,
            ),
        )

    async def GetModelInfo(self, request, context):
        cfg = self._st.cfg
        logprobs = model_pb2.LogprobCapabilities(
            supported=True, candidate_selection_modes=_CANDIDATE_MODES, max_top_n=MAX_TOP_N
        )
        return model_pb2.ModelInfo(
            model_id=cfg.settings.model,
            served_model_name=request.model or cfg.settings.model,
            max_context_length=cfg.settings.context_length,
            max_output_tokens=MAX_OUTPUT_TOKENS,
            supports_text_input=False,
            supports_token_ids_input=True,
            generation=model_pb2.GenerationCapabilities(
                prompt_logprobs=logprobs,
                output_logprobs=logprobs,
                guided_decoding=model_pb2.GuidedDecodingCapabilities(supported=False),
                max_num_sequences=1,
                supports_priority=False,
                supports_stop_in_output=False,
                supports_cache_salt=False,
                supports_prefix_cache_bypass=False,
            ),
            supports_lora=False,
            supports_multimodal=False,
            # the parser that splits this engine's reasoning span (docs/mocker.md
            # "Reasoning spans"); "" = no span
            reasoning_parser=REASONING_PARSERS[0] if cfg.think_end is not None else "",
        )

    async def GetLoad(self, request, context):
        st = self._st
        m = st.engine.scheduler.metrics()
        frozen_at = st.engine.frozen_at_ns
        info = server_pb2.LoadInfo(
            instance_id=st.cfg.instance_id,
            timestamp_unix_nanos=frozen_at if frozen_at is not None else time.time_ns(),
            running_requests=m.running,
            queued_requests=m.waiting,
            used_kv_blocks=m.used_blocks,
            total_kv_blocks=m.total_blocks,
        )
        if st.cfg.settings.role != "aggregated":
            info.active_kv_sessions = sum(1 for live in st.by_key.values() if live.has_session)
        # Generate streams registered and not released yet: what a cancel must bring back to
        # 0 even when the scheduler is done with the request (lab sweep --cancel's leak check)
        info.attributes.update({OPEN_STREAMS_ATTRIBUTE: st.active})
        return info

    async def Health(self, request, context):
        if request.include_inference_probe:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "the inference probe is not simulated by the Mocker server",
            )
        st = self._st
        scheduler_ok = st.executor_failure is None
        checks = [
            lifecycle_pb2.HealthCheck(name="grpc", state=READY),
            lifecycle_pb2.HealthCheck(
                name="scheduler",
                state=READY if scheduler_ok else NOT_READY,
                message="" if scheduler_ok else f"executor failure: {st.executor_failure}",
            ),
            lifecycle_pb2.HealthCheck(name="model", state=READY),
        ]
        return lifecycle_pb2.HealthResponse(
            state=READY if scheduler_ok else NOT_READY, checks=checks
        )

    async def Abort(self, request, context):
        st = self._st
        target = request.WhichOneof("target")
        aborted = lifecycle_pb2.ABORT_STATUS_ABORTED
        finished = lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED
        if target == "request_id":
            live = st.by_id.get(request.request_id)
            if live is None or not st.abort(live):
                return lifecycle_pb2.AbortResponse(
                    status=finished, message=f"request {request.request_id!r} is not in flight"
                )
            return lifecycle_pb2.AbortResponse(
                status=aborted, message=f"request {request.request_id!r} aborted"
            )
        if target == "kv_session":
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "abort by kv_session is not implemented by the TensorRT-LLM OpenEngine server "
                "(a session id is not a Generate request_id)",
            )
        if target == "all_requests":
            count = sum(1 for live in list(st.by_id.values()) if st.abort(live))
            if count:
                return lifecycle_pb2.AbortResponse(
                    status=aborted, message=f"aborted {count} request(s)"
                )
            return lifecycle_pb2.AbortResponse(status=finished, message="no request in flight")
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "AbortRequest needs a target: request_id, kv_session or all_requests",
        )

    async def LoadLora(self, request, context):
        await self._refuse(context, "LoadLora")

    async def UnloadLora(self, request, context):
        await self._refuse(context, "UnloadLora")

    async def ListLoras(self, request, context):
        await self._refuse(context, "ListLoras")

    async def GetKvEventSources(self, request, context):
        await self._refuse(context, "GetKvEventSources")

    async def SubscribeKvEvents(self, request, context):
        await self._refuse(context, "SubscribeKvEvents")
