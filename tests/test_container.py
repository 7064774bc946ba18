"""The image, built and run by a real container engine (`tools/container_check.sh`): a request
in flight during a stop with the engine's default timeout is recorded as cut, and the
HEALTHCHECK is healthy on a port that is not 8080.

It skips, saying why, where no engine can run a container here, or where the base image is not
on this machine (the build cannot pull it without a registry)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "container_check.sh"
BASE = os.environ.get("PYTHON_IMAGE", "python:3.11-slim")


def _engine() -> tuple[str | None, str]:
    """An engine that runs containers from the base image here, or None and why not."""
    engine = os.environ.get("ENGINE") or shutil.which("podman") or shutil.which("docker")
    if engine is None:
        return None, "no container engine (podman or docker) on this machine"
    try:
        found = subprocess.run(
            [engine, "image", "inspect", BASE], capture_output=True, timeout=60, check=False
        )
        if found.returncode != 0:
            return None, f"{engine}: the base image {BASE} is not on this machine"
        ran = subprocess.run(
            [engine, "run", "--rm", BASE, "true"], capture_output=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{engine} does not answer: {exc}"
    if ran.returncode != 0:
        said = ran.stderr.decode(errors="replace").strip().splitlines()
        last = said[-1] if said else f"exit status {ran.returncode}"
        return None, f"{engine} cannot run a container here ({last}; see tools/containers.conf)"
    return engine, ""


def test_the_image_records_what_a_default_stop_cuts_and_is_healthy_on_its_port() -> None:
    engine, why = _engine()
    if engine is None:
        pytest.skip(why)
    env = {**os.environ, "ENGINE": engine}
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "ok"
    assert any(line.startswith("HEALTHCHECK healthy on port ") for line in lines)
    assert any("with the default timeout, exit status 0" in line for line in lines)
    assert any(
        line.startswith("recorded: ")
        and line.endswith("proxy_error: cut at shutdown: shutdown_grace (7s) over")
        for line in lines
    ), lines
