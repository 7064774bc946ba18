"""The A/B of a `python -m bench --base DIR` run: CPU per request of each `flightrec-*` target
over its `base-*` twin, round by round (both had the machine in the same round), and the median
of those ratios; and every target's CPU per request over the relay's, round by round, the same
way (the issue's ratio).

    python -m bench.ab bench/results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def cpu_us(row: dict[str, Any]) -> float | None:
    return row["cpu_s"] / row["ok"] * 1e6 if row.get("ok") and row.get("cpu_s") else None


def ratios(raw: dict[str, list[dict[str, Any]]], engine: str) -> list[tuple[float, float]]:
    """(B, A) CPU per request in µs for each round both ran: B the change, A the base."""
    base = {row["round"]: cpu_us(row) for row in raw.get(f"base-{engine}", [])}
    pairs = []
    for row in raw.get(f"flightrec-{engine}", []):
        b, a = cpu_us(row), base.get(row["round"])
        if a and b:
            pairs.append((b, a))
    return pairs


def over_relay(raw: dict[str, list[dict[str, Any]]], target: str) -> list[float]:
    """The target's CPU per request over the relay's, for each round both ran."""
    relay = {row["round"]: cpu_us(row) for row in raw.get("relay", [])}
    each = []
    for row in raw.get(target, []):
        ours, floor = cpu_us(row), relay.get(row["round"])
        if ours and floor:
            each.append(ours / floor)
    return each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    results = json.loads(parser.parse_args().results.read_text())
    for measure, raw in results["raw"].items():
        for engine in ("sqlite", "postgres"):
            pairs = ratios(raw, engine)
            if not pairs:
                continue
            each = [b / a for b, a in pairs]
            print(
                f"{measure:9} {engine:8} change/base CPU per request: median "
                f"{statistics.median(each):.3f} over {len(each)} rounds "
                f"({', '.join(f'{r:.2f}' for r in each)}); µs median "
                f"{statistics.median(b for b, _ in pairs):.0f} vs "
                f"{statistics.median(a for _, a in pairs):.0f}"
            )
        for target in raw:
            each = over_relay(raw, target) if target != "relay" else []
            if each:
                print(
                    f"{measure:9} {target:17} CPU per request over the relay's: median "
                    f"{statistics.median(each):.3f} ({', '.join(f'{r:.2f}' for r in each)})"
                )


if __name__ == "__main__":
    main()
