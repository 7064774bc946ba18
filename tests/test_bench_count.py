"""`bench.count`: flightrec's instructions a request, counted under valgrind, for real at a
toy size. Checks the counting works and reads what valgrind wrote, never how many there are
beyond a sane range."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import count

CALLGRIND_OUT = b"""# callgrind format
version: 1
creator: callgrind-3.19.0
cmd:  python -m proxy serve
events: Ir
summary: 0
fl=(1) ???
fn=(1) 0x0000000000001000
0x1000 5
totals: 1313059147
"""


def test_totals_are_read_from_the_callgrind_output() -> None:
    assert count.totals(CALLGRIND_OUT) == 1_313_059_147
    with pytest.raises(ValueError, match="no totals"):
        count.totals(b"events: Ir\n")


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_checkout_is_counted_per_request(tmp_path: Path) -> None:
    plain = count.count(count.HERE, requests=20, stream=False, work=tmp_path / "plain")
    # A plain request through flightrec is a few hundred µs of Python: ~10^6 instructions.
    assert 2e5 < plain < 2e7, plain
    assert (tmp_path / "plain" / "callgrind.out").stat().st_size > 0


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_relay_and_flightrec_without_a_database_are_counted_the_same_way(
    tmp_path: Path,
) -> None:
    relay = count.count(None, requests=20, stream=False, work=tmp_path / "relay")
    memory = count.count(count.HERE, 20, False, tmp_path / "memory", memory=True)
    assert 2e5 < relay < memory < 2e7, (relay, memory)
    assert (tmp_path / "memory" / "counts.json").exists()  # the counting recorder ran
