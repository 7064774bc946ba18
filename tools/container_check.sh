#!/usr/bin/env bash
# Checks the image as an operator meets it (docs/operations.md, *The container*):
#   1. builds it from the Dockerfile;
#   2. runs it on a port that is not 8080 (FLIGHTREC_PORT), /data bind-mounted from a directory
#      owned by uid 10001, in front of a slow upstream (15 s before it answers);
#   3. finds its HEALTHCHECK (`flightrec health`) healthy on that port;
#   4. sends a request, stops the container with the engine's default timeout (10 s) while the
#      request is in flight, and checks that it exited by itself (0, not 137);
#   5. reads the database from a new container on the same /data: the exchange is there,
#      recorded as cut at shutdown.
# It prints one line per step and the image's size, and exits non-zero at the first failure.
#
# Usage: tools/container_check.sh            (podman, or docker when podman is absent)
#        ENGINE=docker tools/container_check.sh
# Needs the base image (python:3.11-slim, or PYTHON_IMAGE) and PyPI for the build, python3 and
# curl on the host, and host networking (the container reaches the upstream on 127.0.0.1).
# Where podman cannot run with its defaults (crun and the host's hard limits or cgroups), give
# it tools/containers.conf: CONTAINERS_CONF=tools/containers.conf tools/container_check.sh
# tests/test_container.py runs it when an engine can run containers here.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$ENGINE" ] || { echo "no container engine (podman or docker)" >&2; exit 2; }
TAG=${TAG:-flightrec:check}
NAME=flightrec-check-$$
WORK=$(mktemp -d)
UPSTREAM_PID=
cleanup() {
  "$ENGINE" rm -f "$NAME" >/dev/null 2>&1 || true
  [ -z "$UPSTREAM_PID" ] || kill "$UPSTREAM_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
say() { printf '%s\n' "$*"; }
fail() { say "FAILED: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

build=()
[ "$(basename "$ENGINE")" = podman ] && build+=(--format docker)  # HEALTHCHECK is Docker-format only
[ -z "${PYTHON_IMAGE:-}" ] || build+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
started=$(date +%s)
"$ENGINE" build "${build[@]}" -t "$TAG" . >"$WORK/build.log" 2>&1 \
  || { tail -20 "$WORK/build.log" >&2; fail "build"; }
size=$("$ENGINE" image inspect --format '{{.Size}}' "$TAG")
say "built $TAG in $(($(date +%s) - started))s: $((size / 1000000)) MB"

# The slow upstream: every chat completion answers after 15 s.
UP=$(free_port)
python3 - "$UP" <<'EOF' >"$WORK/upstream.log" 2>&1 &
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Slow(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(15)
        body = json.dumps({"id": "chatcmpl-slow", "object": "chat.completion", "created": 1,
                           "model": "m", "choices": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Slow).serve_forever()
EOF
UPSTREAM_PID=$!

PORT=$(free_port)
mkdir "$WORK/data" && chown 10001 "$WORK/data"  # the image's user must be able to write /data
"$ENGINE" run -d --name "$NAME" --network host --health-interval 2s \
  -e FLIGHTREC_PORT="$PORT" -e FLIGHTREC_CONSOLE_PORT=0 \
  -e FLIGHTREC_UPSTREAM="http://127.0.0.1:$UP/v1" \
  -v "$WORK/data:/data" "$TAG" >/dev/null

healthy() {  # podman runs HEALTHCHECKs from systemd timers, so ask it to run one now
  if [ "$(basename "$ENGINE")" = podman ]; then
    "$ENGINE" healthcheck run "$NAME" >/dev/null 2>&1
  else
    [ "$("$ENGINE" inspect --format '{{.State.Health.Status}}' "$NAME")" = healthy ]
  fi
}
for _ in $(seq 60); do healthy && break; sleep 1; done
healthy || { "$ENGINE" logs "$NAME" >&2; fail "HEALTHCHECK not healthy on port $PORT"; }
say "HEALTHCHECK healthy on port $PORT: $("$ENGINE" exec "$NAME" flightrec health)"

curl -sS -m 30 -o /dev/null -H 'Content-Type: application/json' \
  -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}' \
  "http://127.0.0.1:$PORT/v1/chat/completions" 2>"$WORK/curl.err" &
client=$!
sleep 1  # the request is on its way to the upstream, which answers 14 s from now
started=$(date +%s.%N)
"$ENGINE" stop "$NAME" >/dev/null  # the engine's default timeout: 10 s, then SIGKILL
took=$(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')")
status=$("$ENGINE" inspect --format '{{.State.ExitCode}}' "$NAME")
wait "$client" || true
say "stopped in ${took}s with the default timeout, exit status $status; client: $(cat "$WORK/curl.err")"
[ "$status" = 0 ] || { "$ENGINE" logs "$NAME" >&2; fail "exit status $status (137: killed)"; }

in_new() { "$ENGINE" run --rm -v "$WORK/data:/data" "$TAG" "$@"; }  # a new container, same /data
ids=$(in_new flightrec logs --json | python3 -c 'import json, sys; print(*[r["id"] for r in json.load(sys.stdin)])')
[ -n "$ids" ] && [ "$ids" = "${ids%% *}" ] || fail "expected one exchange in the database, found: '$ids'"
in_new flightrec show "$ids" --json >"$WORK/show.json"
python3 - "$WORK/show.json" <<'EOF' || { cat "$WORK/show.json" >&2; fail "the exchange is not recorded as cut"; }
import json, sys
row = json.load(open(sys.argv[1]))
assert row["outcome"] == "proxy_error" and row["error"].startswith("cut at shutdown"), row
print(f"recorded: {row['id']} {row['outcome']}: {row['error']}")
EOF
say "ok"
