"""The Grafana dashboard (deploy/grafana/inferwatch-golden-signals.json) as the e2e tests read it:
its panels grouped by row, their PromQL queries, and the template variables substituted the way
Grafana would (a value, or `.*` for "All")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .agent import REPO

PATH = REPO / "deploy" / "grafana" / "inferwatch-golden-signals.json"

#: Grafana's built-in interval variables and the values the tests put in.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s"}


def load(path: Path = PATH) -> dict[str, Any]:
    """The dashboard JSON."""
    return json.loads(path.read_text())


def rows(dash: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Row title -> the panels laid out below it (up to the next row); panels above the first row
    go under ""."""
    out: dict[str, list[dict[str, Any]]] = {}
    current = ""
    for p in sorted(dash["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        if p["type"] == "row":
            current = p["title"]
            out.setdefault(current, [])
            out[current].extend(p.get("panels", []))  # a collapsed row holds its panels
        else:
            out.setdefault(current, []).append(p)
    return out


def variables(dash: dict[str, Any]) -> set[str]:
    """Names of the dashboard's template variables."""
    return {v["name"] for v in dash["templating"]["list"]}


def used_variables(expr: str) -> set[str]:
    """The `$name` / `${name}` variables an expression uses, built-ins excluded."""
    return set(re.findall(r"\$\{?(\w+)", expr)) - set(BUILTINS)


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with each variable replaced by `values[name]`, else `.*` (Grafana's "All"), and the
    built-in intervals by BUILTINS."""
    allv = {**BUILTINS, **values}
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: allv.get(m.group(1) or m.group(2), ".*"), expr)


def queries(panels: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(panel, expr) of every PromQL target of `panels`."""
    return [(p, t["expr"]) for p in panels for t in p.get("targets", []) if "expr" in t]
