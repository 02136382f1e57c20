"""Errors the launcher raises; the CLI turns them into messages, never tracebacks."""

from __future__ import annotations

from pathlib import Path


class LaunchError(Exception):
    """A process did not become ready (or exited before it was ready).

    `name` is the launcher's process name (e.g. "sidecar-decode-0"), `log_tail` the last lines of
    its log, so that the message alone tells the user what went wrong.
    """

    def __init__(
        self, name: str, reason: str, log_tail: str = "", log_path: Path | None = None
    ) -> None:
        self.name = name
        self.reason = reason
        self.log_tail = log_tail
        self.log_path = log_path
        super().__init__(self.message())

    def message(self) -> str:
        text = f"{self.name} did not become ready: {self.reason}"
        if self.log_tail:
            if self.log_path is not None:
                text += f"\n--- last lines of {self.log_path} ---"
            text += "\n" + self.log_tail.rstrip("\n")
        return text


class TopologyError(ValueError):
    """A topology (flags or TOML file) that cannot be launched; the message names key and line."""


class RunError(Exception):
    """A run directory or detached run that cannot be used (`lab ps/down/fault RUN`)."""
