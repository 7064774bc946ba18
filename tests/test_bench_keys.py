"""`bench.bench_keys`: the session keys of agent-sized requests, this checkout against another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.bench_keys import SHAPES, conversation

ROOT = Path(__file__).resolve().parent.parent


def test_its_requests_carry_a_history_with_assistant_messages() -> None:
    roles = [m["role"] for m in conversation(2, 100)["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool", "user"]


def test_it_compares_two_checkouts_row_by_row() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_keys", "--base", str(ROOT), "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(SHAPES)
    messages = [int(row.split("|")[1]) for row in rows]
    assert messages == [len(conversation(*shape)["messages"]) for shape in SHAPES]
    assert all(row.rstrip(" |").endswith("x") for row in rows)
