"""A JSON object given on a command line or in a topology file: inline, or the path of a file.

`--engine-args` of `mocker serve`, `lab up` and `lab sweep` (and a topology's `engine_args`)
all accept either form; one reader keeps their rules and their error messages the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_object(value: str, what: str) -> dict[str, Any]:
    """`value` as a JSON object: inline JSON when it starts with "{", else a file's contents.

    ValueError names `what` and `value`: an unreadable file, invalid JSON, or not an object.
    """
    text = value.strip()
    if not text.startswith("{"):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise ValueError(
                f"{what} {value!r}: not JSON and not a readable file ({exc.strerror or exc})"
            ) from exc
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {value!r} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{what} {value!r}: expected a JSON object")
    return obj
