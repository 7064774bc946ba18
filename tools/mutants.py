"""Mutation check of the test suite: put one deliberate bug in a copy of the repository, run the
whole suite there, and see that a test catches it.

    .venv/bin/python tools/mutants.py --list
    .venv/bin/python tools/mutants.py                  # every mutant, one after the other
    .venv/bin/python tools/mutants.py --only NAME ...  # some of them
    .venv/bin/python tools/mutants.py --check          # every snippet still found once?

Each mutant replaces an exact snippet of today's code, which must occur exactly once (else the
run stops and says so: the code moved on and the table needs updating). The copy holds the
repository's files as they are in the work tree (tracked and untracked, not ignored), with
`../shared` linked beside it as in a checkout, and imports `proxy` from the copy. A mutant is
caught when the suite fails; the first failing test is reported. Exit status 1 if any
survived or could not be applied. PostgreSQL tests run only with FLIGHTREC_TEST_PG_URL set
(as `.ci/run` sets it): without it the PostgreSQL mutant survives.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    breaks: str


MUTANTS = [
    Mutant(
        "withhold-every-usage-event",
        "proxy/stream/withhold.py",
        '    return chunk.get("choices") == [] and bool(chunk.get("usage"))',
        '    return bool(chunk.get("usage"))',
        "vLLM's continuous usage: content chunks with usage withheld from the client",
    ),
    Mutant(
        "api-key-header-hint-whole",
        "proxy/relay/headers.py",
        '    key = key or headers.get("api-key") or headers.get("x-api-key")\n',
        '    key = key or headers.get("api-key") or headers.get("x-api-key")\n'
        "    if key and not auth:\n"
        "        return _identify(key)[0], key\n",
        "an Azure api-key / x-api-key stored whole as the key hint",
    ),
    Mutant(
        "short-key-hint-whole",
        "proxy/relay/headers.py",
        'if len(key) >= 12 else "..."',
        "if len(key) >= 12 else key",
        "a key shorter than 12 characters stored whole as the hint",
    ),
    Mutant(
        "first-prefix-not-longest",
        "proxy/relay/paths.py",
        "if best is None or len(prefix) > len(best[0].prefix):",
        "if best is None:",
        "overlapping upstream prefixes: the first match wins, not the longest",
    ),
    Mutant(
        "readyz-always-200",
        "proxy/relay/app.py",
        '    if reason is None:\n        return web.json_response({"status": "ready", **body})',
        '    if True:\n        return web.json_response({"status": "ready", **body})',
        "/readyz says ready while the record cannot keep up",
    ),
    Mutant(
        "omit-request-alone-ignored",
        "proxy/relay/headers.py",
        'controls.omit_request = bool(parts & {"request", "all"})',
        'controls.omit_request = bool(parts & {"all"})',
        "X-Flightrec-Omit: request (alone) stores the request body",
    ),
    Mutant(
        "omit-response-alone-ignored",
        "proxy/relay/headers.py",
        'controls.omit_response = bool(parts & {"response", "all"})',
        'controls.omit_response = bool(parts & {"all"})',
        "X-Flightrec-Omit: response (alone) stores the response body",
    ),
    Mutant(
        "silent-upstream-as-disconnect",
        "proxy/relay/response.py",
        '    except TimeoutError:\n        tee.exchange.report("timeout",',
        '    except TimeoutError:\n        tee.exchange.report("upstream_disconnected",',
        "an upstream gone silent mid-stream recorded as upstream_disconnected, not timeout",
    ),
    Mutant(
        "no-identity-encoding-when-injecting",
        "proxy/relay/forward.py",
        "upstream_headers(request.headers, identity_encoding=body.injected, controls=controls)",
        "upstream_headers(request.headers, identity_encoding=False, controls=controls)",
        "a compressed stream while injecting: the usage event cannot be withheld",
    ),
    Mutant(
        "max-record-bytes-body",
        "proxy/stream/reader.py",
        "if len(self._body) + len(data) > self._max:",
        "if False:",
        "a response body larger than max_record_bytes recorded whole",
    ),
    Mutant(
        "max-record-bytes-events",
        "proxy/stream/reader.py",
        "            if not self.truncated:\n                self._events.append(chunk)\n",
        "            self._events.append(chunk)\n",
        "a stream of unknown events larger than max_stream_record_bytes recorded whole",
    ),
    Mutant(
        "stored-id-check-removed-sqlite",
        "proxy/store/sqlite_writer.py",
        "fresh = not_stored(by_id, _stored_ids(con, list(by_id)))",
        "fresh = not_stored(by_id, [])",
        "an exchange recorded twice (spool replay) written twice to SQLite",
    ),
    Mutant(
        "stored-id-check-removed-postgres",
        "proxy/store/pg_writer.py",
        "fresh = not_stored(by_id, found.scalars())",
        "fresh = not_stored(by_id, [])",
        "an exchange recorded twice (spool replay) written twice to PostgreSQL",
    ),
    Mutant(
        "responses-arguments-setdefault",
        "proxy/stream/responses.py",
        "                elif text is not None:\n                    item[key] = text\n",
        "                elif text is not None:\n                    item.setdefault(key, text)\n",
        "a Responses stream cut mid function call records empty arguments",
    ),
    Mutant(
        "responses-summary-not-collected",
        "proxy/stream/responses.py",
        '    "response.reasoning_summary_text": "summary",\n',
        "",
        "a Responses stream cut mid reasoning summary loses the summary",
    ),
    Mutant(
        "responses-no-rebuild-from-done",
        "proxy/stream/responses.py",
        'if self._final.get("output") or not self._items:',
        "if True:",
        "a response.completed without output leaves the record without output",
    ),
    Mutant(
        "transcription-model-not-read",
        "proxy/relay/record.py",
        'payload = form_fields(exchange.request_body, headers.get("Content-Type", ""), FORM_KEYS)',
        "pass",
        "a transcription's model (a form field) unread: model and cost null",
    ),
    Mutant(
        "responses-ttft-skips-reasoning",
        "proxy/stream/responses.py",
        "                self._strings.setdefault(place, []).append(delta)\n"
        "                return True\n",
        "                self._strings.setdefault(place, []).append(delta)\n"
        '                return "reasoning" not in kind\n',
        "ttft_ms of a Responses reasoning stream taken at the first non-reasoning token",
    ),
    Mutant(
        "chat-ttft-skips-reasoning-content",
        "proxy/stream/chat.py",
        '_OUTPUT_TEXT = frozenset({"content", "refusal", "reasoning_content", "reasoning"})',
        '_OUTPUT_TEXT = frozenset({"content", "refusal"})',
        "ttft_ms of a chat reasoning stream (vLLM/DeepSeek) taken at the first content",
    ),
]


FIRST = {
    "withhold-every-usage-event": "tests/relay/test_stream_relay.py",
    "api-key-header-hint-whole": "tests/relay/test_passthrough.py",
    "short-key-hint-whole": "tests/relay/test_passthrough.py",
    "first-prefix-not-longest": "tests/relay/test_passthrough.py",
    "readyz-always-200": "tests/store/test_journal_faults.py",
    "omit-request-alone-ignored": "tests/relay/test_passthrough.py",
    "omit-response-alone-ignored": "tests/relay/test_passthrough.py",
    "silent-upstream-as-disconnect": "tests/relay/test_passthrough.py",
    "no-identity-encoding-when-injecting": "tests/relay/test_stream_relay.py",
    "max-record-bytes-body": "tests/relay/test_passthrough.py",
    "max-record-bytes-events": "tests/relay/test_stream_relay.py",
    "stored-id-check-removed-sqlite": "tests/store/test_recorder.py",
    "stored-id-check-removed-postgres": "tests/store/test_recorder.py",
    "responses-arguments-setdefault": "tests/stream/test_responses.py",
    "responses-summary-not-collected": "tests/stream/test_responses.py",
    "responses-no-rebuild-from-done": "tests/stream/test_responses.py",
    "transcription-model-not-read": "tests/stream/test_audio.py",
    "responses-ttft-skips-reasoning": "tests/relay/test_ttft.py",
    "chat-ttft-skips-reasoning-content": "tests/stream/test_chat.py",
}
"""The test module that names each mutant's behaviour: it runs first, alone; the whole suite
runs for a mutant it lets through."""


def repository_files() -> list[str]:
    """The work tree's files that git knows of or would add (tracked or untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def make_copy(files: list[str], where: Path) -> Path:
    repo = where / ROOT.name
    for name in files:
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    shared = (ROOT.parent / "shared").resolve()
    if shared.is_dir():
        (where / "shared").symlink_to(shared)
    return repo


def apply(mutant: Mutant, repo: Path) -> None:
    path = repo / mutant.path
    text = path.read_text(encoding="utf-8")
    found = text.count(mutant.old)
    if found != 1:
        raise ValueError(
            f"{mutant.name}: the snippet occurs {found} times in {mutant.path}, not once: "
            "update the table"
        )
    path.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.MULTILINE)


def run_suite(repo: Path, timeout: float, pytest_args: list[str]) -> tuple[str, str]:
    """(verdict, detail): "caught" with the first failing test, "survived", or "timeout"."""
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import proxy; print(proxy.__file__)"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(repo)):
        raise RuntimeError(f"the copy imports proxy from {where}, not from {repo}")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *pytest_args]
    try:
        done = subprocess.run(
            command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return "timeout", f"suite still running after {timeout:.0f} s"
    if done.returncode == 0:
        return "survived", "every test passed"
    failed = _FAILED.search(done.stdout)
    if failed:
        return "caught", failed.group(2)
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return "caught", f"pytest exit {done.returncode}: " + " | ".join(tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument(
        "--check", action="store_true", help="only see that each snippet is found exactly once"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per suite run")
    parser.add_argument("--keep", action="store_true", help="keep the copies (printed)")
    parser.add_argument(
        "pytest_args", nargs="*", help="after --: what pytest runs instead of the whole suite"
    )
    args = parser.parse_args()
    names = {m.name for m in MUTANTS}
    if len(names) != len(MUTANTS):
        parser.error("two mutants share a name")
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:40} {m.path:30} {m.breaks}")
        return 0
    unknown = set(args.only or ()) - names
    if unknown:
        parser.error(f"unknown mutants: {', '.join(sorted(unknown))} (see --list)")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.check:
        missing = [m.name for m in chosen if (ROOT / m.path).read_text().count(m.old) != 1]
        for name in missing:
            print(f"{name}: snippet not found exactly once")
        return 1 if missing else 0
    files = repository_files()
    results: list[tuple[str, str, str]] = []
    for mutant in chosen:
        where = Path(tempfile.mkdtemp(prefix=f"mutant-{mutant.name}-"))
        started = time.monotonic()
        try:
            repo = make_copy(files, where)
            apply(mutant, repo)
            if args.pytest_args:
                verdict, detail = run_suite(repo, args.timeout, args.pytest_args)
            else:  # the named module alone first (pytest would run a module inside `tests`
                # in the directory's order), then, if it let the mutant through, the whole suite
                verdict, detail = run_suite(repo, args.timeout, [FIRST.get(mutant.name, "tests")])
                if verdict == "survived":
                    verdict, detail = run_suite(repo, args.timeout, ["tests"])
        except (ValueError, RuntimeError) as exc:
            verdict, detail = "not applied", str(exc)
        finally:
            if args.keep:
                print(f"  kept {where}", file=sys.stderr)
            else:
                shutil.rmtree(where, ignore_errors=True)
        took = time.monotonic() - started
        print(f"{mutant.name:40} {verdict:12} {took:5.0f} s  {detail}", flush=True)
        results.append((mutant.name, verdict, detail))
    caught = sum(verdict == "caught" for _, verdict, _ in results)
    print(f"\n{caught} of {len(results)} mutants caught")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
