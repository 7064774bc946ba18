# flightrec in a small non-root image: serves on 0.0.0.0:8080, database and journal on /data.
# Two stages: the first builds flightrec's wheel and fetches every dependency at the version
# requirements.lock pins (`make lock` renews it); the second installs only those wheels, so
# neither the source tree nor a build tool is in the image.
# docs/operations.md (*The container*) says how to run it, stop it and reach its console.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY proxy ./proxy
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels --constraint requirements.lock . \
    && cp requirements.lock /wheels/ && cd /wheels && sha256sum *.whl > SHA256SUMS

FROM ${PYTHON_IMAGE}
RUN useradd --create-home --uid 10001 flightrec && mkdir /data && chown flightrec /data
# The wheels' digests, kept in the image, also make any change to them a new layer: an engine
# that caches a RUN by its text alone (buildah) would otherwise reuse the last install.
COPY --from=build /wheels/SHA256SUMS /usr/local/share/flightrec/wheels.sha256
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels \
        --constraint /wheels/requirements.lock flightrec

USER flightrec
WORKDIR /data
VOLUME /data
# Engines wait 10 s (Docker, podman) or 30 s (Kubernetes) after SIGTERM before SIGKILL. In-flight
# exchanges get 7 s; those still running then are cut, recorded as cut and journaled, and the
# rest of the 10 s is left for the final write. Raise it together with the engine's timeout.
ENV FLIGHTREC_HOST=0.0.0.0 \
    FLIGHTREC_PORT=8080 \
    FLIGHTREC_DB_URL=sqlite+aiosqlite:////data/flightrec.db \
    FLIGHTREC_SPOOL_PATH=/data/flightrec.spool \
    FLIGHTREC_SHUTDOWN_GRACE=7
EXPOSE 8080
STOPSIGNAL SIGTERM
# Asks the port the proxy serves on, from the same config (FLIGHTREC_PORT, a config file).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["flightrec", "health"]
CMD ["flightrec", "serve"]
