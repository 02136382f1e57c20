"""Stand-ins for `mocker serve`, `lab sidecar` and `lab frontend` (same flags, same ready lines,
same readiness signals), so the launcher's supervision is tested without the real fleet.

    python fake_proc.py mocker serve --listen 127.0.0.1:0 --instance-id ID ...
    python fake_proc.py lab sidecar --engine ADDR --listen 127.0.0.1:0 --discovery file:DIR ...
    python fake_proc.py lab frontend --listen 127.0.0.1:0 --discovery file:DIR --expect role=n

Behaviour knobs (environment; NAMES = comma-separated launcher process names):
    FAKE_FAIL_START=NAMES   exit 3 at once
    FAKE_NEVER_READY=NAMES  never log a ready line
    FAKE_TRIGGER_DIR=DIR    once ready, exit 1 when DIR/exit-<name> appears (the file is consumed)
    FAKE_IGNORE_TERM=NAMES  ignore SIGTERM (teardown must SIGKILL)
A fake sidecar exits 1 ("engine lost") when its engine's health check fails, like the real one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.wire.ready import format_ready

NAME = os.environ.get("LAB_PROCESS_NAME", "")
STOP = threading.Event()


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} fake {NAME}: {message}", file=sys.stderr, flush=True)


def knob(var: str) -> bool:
    return NAME in os.environ.get(var, "").split(",")


def on_term(signum: int, frame: object) -> None:
    if knob("FAKE_IGNORE_TERM"):
        log("ignoring SIGTERM")
        return
    STOP.set()


def triggered() -> bool:
    """True once per DIR/exit-<name> file (consumed), so a restarted process keeps running."""
    directory = os.environ.get("FAKE_TRIGGER_DIR")
    if not directory:
        return False
    try:
        (Path(directory) / f"exit-{NAME}").unlink()
    except FileNotFoundError:
        return False
    return True


def lifecycle_start() -> None:
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if knob("FAKE_FAIL_START"):
        log("failing on purpose: bad configuration")
        sys.exit(3)
    if knob("FAKE_NEVER_READY"):
        log("hanging on purpose (no ready line)")
        while not STOP.wait(0.1):
            pass
        sys.exit(0)


def health_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def engine(argv: list[str]) -> None:
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--instance-id", default="fake-engine")
    parser.add_argument("--admin-listen", default=None)
    args, _ = parser.parse_known_args(argv)
    lifecycle_start()
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(4))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port(args.listen)
    server.start()
    extra = {"admin": f"127.0.0.1:{port}"} if args.admin_listen else {}
    log(format_ready("engine", args.instance_id, f"127.0.0.1:{port}", **extra))
    while not STOP.wait(0.1):
        if triggered():
            log("exiting 1 on purpose")
            os._exit(1)
    server.stop(0.5)
    log("stopped")


def sidecar(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--discovery", required=True)
    parser.add_argument("--worker-id", required=True)
    args, _ = parser.parse_known_args(argv)
    lifecycle_start()
    while not health_serving(args.engine):
        if STOP.wait(0.2):
            sys.exit(0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    directory = Path(args.discovery.removeprefix("file:"))
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / f"{args.worker_id}.json"
    tmp = directory / f".{args.worker_id}.tmp"
    tmp.write_text(json.dumps({"worker_id": args.worker_id, "address": address,
                               "pid": os.getpid(), "updated_at": time.time()}))
    tmp.replace(record)
    log(format_ready("sidecar", args.worker_id, address))
    code = 0
    while not STOP.wait(0.1):
        if triggered():
            log("engine lost: fake loss on purpose")
            code = 1
            break
        if not health_serving(args.engine):
            log(f"engine lost: health check failed ({args.engine})")
            code = 1
            break
    record.unlink(missing_ok=True)
    log(f"withdrawn, exit {code}")
    sys.exit(code)


def frontend(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--discovery", required=True)
    parser.add_argument("--expect", action="append", default=[])
    args, _ = parser.parse_known_args(argv)
    lifecycle_start()
    directory = Path(args.discovery.removeprefix("file:"))
    expected = sum(int(e.partition("=")[2]) for e in args.expect) or 1

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            live = len(list(directory.glob("*.json"))) if directory.is_dir() else 0
            status = 200 if live >= expected and self.path == "/health" else 503
            state = "healthy" if status == 200 else "unhealthy"
            body = json.dumps({"status": state, "workers": live, "expected": expected}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    host, _, port = args.listen.rpartition(":")
    server = ThreadingHTTPServer((host, int(port)), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(format_ready("frontend", "frontend", f"127.0.0.1:{server.server_address[1]}"))
    while not STOP.wait(0.1):
        pass
    server.shutdown()


def main() -> None:
    program, command, *rest = sys.argv[1:]
    if (program, command) == ("mocker", "serve"):
        engine(rest)
    elif (program, command) == ("lab", "sidecar"):
        sidecar(rest)
    elif (program, command) == ("lab", "frontend"):
        frontend(rest)
    else:
        sys.exit(f"fake_proc: unknown command {program} {command}")


if __name__ == "__main__":
    main()
