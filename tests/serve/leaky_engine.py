"""`python -m tests.serve.leaky_engine serve ...`: the mocker with a deliberate leak, for the
leak check's tests (never a switch in the package).

A cancelled request leaves the scheduler (it is no longer running or queued) but its KV blocks
are never given back: after a level with cancels, the engine's GetLoad keeps `used_kv_blocks`
above its idle value, which the check must report naming this engine. The launcher runs it in
place of `mocker` through LAB_LAUNCH_MOCKER (`launch.commands.Programs.default`).
"""

from __future__ import annotations

from mocker.engine import scheduler as _scheduler


def _cancel_keeping_blocks(self: _scheduler.Scheduler, key: str) -> bool:
    r = self._reqs.pop(key, None)
    if r is None:
        return self._held.pop(key, None) is not None
    if r.state == _scheduler._RUNNING:
        self._running.remove(r)  # the leak: no self._release(r)
    else:
        self._waiting.remove(r)
    return True


_scheduler.Scheduler.cancel = _cancel_keeping_blocks  # type: ignore[method-assign]

if __name__ == "__main__":
    from mocker.cli import main

    main()
