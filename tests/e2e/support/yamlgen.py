"""A tiny block-style YAML writer for configuration dicts (no PyYAML needed).

Strings are always double-quoted (JSON string syntax is valid YAML), so values such as
`127.0.0.1:4317`, `10s` or `true`-looking text keep their meaning.
"""

from __future__ import annotations

import json
from typing import Any


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    raise TypeError(f"cannot write {type(v).__name__} as YAML")


def _key(k: Any) -> str:
    k = str(k)
    # Component ids such as otlp/x and plain words need no quotes; anything odd is quoted.
    if k and all(c.isalnum() or c in "_/-." for c in k):
        return k
    return json.dumps(k)


def _emit(v: Any, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    if isinstance(v, dict):
        for k, val in v.items():
            if isinstance(val, dict) and val:
                out.append(f"{pad}{_key(k)}:")
                _emit(val, indent + 1, out)
            elif isinstance(val, (list, tuple)) and val:
                out.append(f"{pad}{_key(k)}:")
                _emit(val, indent + 1, out)
            elif isinstance(val, dict):
                out.append(f"{pad}{_key(k)}: {{}}")
            elif isinstance(val, (list, tuple)):
                out.append(f"{pad}{_key(k)}: []")
            else:
                out.append(f"{pad}{_key(k)}: {_scalar(val)}")
    elif isinstance(v, (list, tuple)):
        for item in v:
            if isinstance(item, (dict, list, tuple)) and item:
                out.append(f"{pad}-")
                _emit(item, indent + 1, out)
            else:
                out.append(f"{pad}- {_scalar(item) if not isinstance(item, (dict, list, tuple)) else ('{}' if isinstance(item, dict) else '[]')}")
    else:
        out.append(f"{pad}{_scalar(v)}")


def dump(cfg: dict) -> str:
    """Renders `cfg` as block YAML."""
    out: list[str] = []
    _emit(cfg, 0, out)
    return "\n".join(out) + "\n"
