"""`python -m tests.realengine up --tokenizer DIR [--model-dir DIR] [--log FILE]`: write the
model (once) and run vLLM's OpenAI server in the foreground; prints the URL and the pids for
`lab sweep --target URL --server-pid ...`; Ctrl-C (or SIGTERM) stops the whole process group."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.realengine.model import write_model
from tests.realengine.server import MODEL_NAME, start


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the server like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.realengine")
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="a HuggingFace tokenizer dir (tokenizer.json)")
    parser.add_argument("--model-dir", type=Path,
                        help="where the model is written (default: a temporary dir)")
    parser.add_argument("--log", type=Path, help="the server's log (default: in the model dir)")
    opts = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="realengine-"))
    model = write_model(opts.tokenizer, opts.model_dir or work / "model")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with it ignored
    server = None
    try:
        server = start(model, opts.log or work / "server.log")
        pids = " ".join(f"--server-pid {k}={v}" for k, v in server.pids().items())
        print(f"vLLM serving {MODEL_NAME} at {server.url} (ready in {server.started_s:.0f} s; "
              f"log {server.log_path})\npids: {pids}", flush=True)
        while server.popen.poll() is None:
            time.sleep(0.5)
        print(f"vLLM exited with {server.popen.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
