"""Small helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import platform

import jax


def machine() -> str:
    """One line naming the hardware the figures were measured on."""
    d = jax.devices()[0]
    host = platform.processor() or platform.machine()
    return f"{d.platform}:{d.device_kind} x{jax.device_count()} ({host})"


def report(title: str, rows: dict, out: str | None) -> None:
    """Print `rows` as a two-column table and, with `out`, write them as JSON."""
    print(title)
    width = max(len(k) for k in rows)
    for k, v in rows.items():
        shown = (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}") if isinstance(v, float) else str(v)
        print(f"  {k:<{width}}  {shown}")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=2)
        print(f"wrote {out}")
