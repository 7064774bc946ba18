# A small non-root image: serves on 0.0.0.0:8080, database and spool on the /data volume.
FROM python:3.11-slim

RUN useradd --create-home --uid 10001 flightrec && mkdir /data && chown flightrec /data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY migrations ./migrations
RUN pip install --no-cache-dir . && rm -rf /root/.cache

USER flightrec
VOLUME /data
ENV FLIGHTREC_HOST=0.0.0.0 \
    FLIGHTREC_PORT=8080 \
    FLIGHTREC_DB_URL=sqlite+aiosqlite:////data/flightrec.db \
    FLIGHTREC_SPOOL_PATH=/data/flightrec.spool
EXPOSE 8080
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"
CMD ["flightrec", "serve"]
