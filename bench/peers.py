"""Peers to compare against, where they can be installed here: nginx `proxy_pass` (Debian
package) and the LiteLLM proxy (its own virtualenv in `bench/.litellm-venv`). A peer that cannot
be installed or started comes back as a skipped `Target` with the reason; it is never faked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .procs import Target, free_port

LITELLM_VENV = Path(__file__).resolve().parent / ".litellm-venv"

NGINX_CONF = """\
# One worker, like the single-event-loop Python targets it is compared with.
worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{user}
events {{ worker_connections 8192; }}
http {{
    access_log off;
    # Request bodies stay in memory (the default spills those over 16 KiB to a temp file).
    client_body_buffer_size 1m;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream mock {{
        server 127.0.0.1:{upstream_port};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""

LITELLM_CONF = """\
model_list:
  - model_name: gpt-4o-mini
    litellm_params:
      model: openai/gpt-4o-mini
      api_base: http://127.0.0.1:{upstream_port}/v1
      api_key: sk-fake-bench-key
litellm_settings:
  telemetry: false
"""


def _run(argv: list[str], timeout: float) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else f"exit {done.returncode}"


def _install_nginx() -> str | None:
    """Install Debian's nginx if it is missing; the reason it cannot be, or None."""
    if shutil.which("nginx"):
        return None
    if os.geteuid() != 0:
        return "nginx is not installed and installing the Debian package needs root"
    ok, why = _run(["apt-get", "install", "-y", "-q", "nginx-light"], 600)
    if not ok:
        _run(["apt-get", "update", "-q"], 600)
        ok, why = _run(["apt-get", "install", "-y", "-q", "nginx-light"], 600)
    if not ok or not shutil.which("nginx"):
        return f"apt-get install nginx-light failed: {why}"
    return None


def nginx(upstream_port: int, workdir: Path, install: bool = True) -> Target:
    target = Target("nginx", "nginx proxy_pass (Debian package), 1 worker, keepalive upstream")
    reason = _install_nginx() if install else (None if shutil.which("nginx") else "not installed")
    if reason is not None:
        target.skipped = reason
        return target
    home = workdir / "nginx"
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    # As root, nginx's workers drop to an unprivileged user, which must reach the temp dirs.
    user = "user nobody nogroup;" if os.geteuid() == 0 else ""
    if user:
        for path in [home, *home.iterdir()]:
            path.chmod(0o777)
    target.port = free_port()
    conf = home / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(dir=home, user=user, upstream_port=upstream_port, port=target.port)
    )
    nginx_bin = shutil.which("nginx") or "nginx"
    target.argv = [nginx_bin, "-e", str(home / "error.log"), "-p", str(home), "-c", str(conf)]
    return target


def _install_litellm() -> str | None:
    """Create `bench/.litellm-venv` with `litellm[proxy]` if it is not there; why not, or None."""
    if (LITELLM_VENV / "bin" / "litellm").exists():
        return None
    ok, why = _run([sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)], 300)
    if ok:
        pip = str(LITELLM_VENV / "bin" / "pip")
        ok, why = _run([pip, "install", "-q", "litellm[proxy]"], 1200)
    if not ok or not (LITELLM_VENV / "bin" / "litellm").exists():
        return f"pip install 'litellm[proxy]' into {LITELLM_VENV.name} failed: {why}"
    return None


def litellm(upstream_port: int, workdir: Path, install: bool = True) -> Target:
    target = Target(
        "litellm",
        "LiteLLM proxy (own venv), 1 uvicorn worker, model mapped to the mock upstream",
        ready_path="/health/liveliness",
        ready_timeout=180.0,
    )
    if install:
        reason = _install_litellm()
    else:
        reason = None if (LITELLM_VENV / "bin" / "litellm").exists() else "not installed"
    if reason is not None:
        target.skipped = reason
        return target
    home = workdir / "litellm"
    home.mkdir(parents=True, exist_ok=True)
    conf = home / "config.yaml"
    conf.write_text(LITELLM_CONF.format(upstream_port=upstream_port))
    target.port = free_port()
    target.argv = [
        str(LITELLM_VENV / "bin" / "litellm"),
        "--config",
        str(conf),
        "--host",
        "127.0.0.1",
        "--port",
        str(target.port),
        "--num_workers",
        "1",
    ]
    target.env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "OPENAI_API_KEY": "sk-fake-bench-key",
        # No master key: LiteLLM then skips authenticating each request, the least work it
        # can do per request, so the comparison is generous to it.
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }
    target.cwd = str(home)
    return target
