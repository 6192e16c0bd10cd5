# The rewardflow image: the `rewardflow` console script on python:3.11-slim, run as a
# non-root user. The default command is `rewardflow run` (the stream worker and the
# ClickHouse sink in one process), configured by REWARDFLOW_* variables (README
# "Configuration"); docker-compose.yml runs it against Kafka and a ClickHouse server.
#   docker build -t rewardflow:local .
#   docker run --rm rewardflow:local --help
#
# Layers: the dependencies come from pyproject's [project].dependencies alone and are
# installed before any source is copied, so a source change rebuilds only the small
# project layer; the project is installed from a wheel built in its own stage.

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# [project].dependencies as a requirements file. A pyproject change elsewhere (version,
# tool settings, extras) gives the same file, and the dependency layer below stays cached.
FROM base AS requirements
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt

# The dependencies in a virtualenv: the large layer (chDB, pyarrow, librdkafka), built once.
FROM base AS deps
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY --from=requirements /tmp/requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt

# The project as a wheel (pure Python: rewardflow, its bundled reward specs, and
# rewardflow_streams from streams/); the build tools stay in this stage.
FROM base AS wheel
WORKDIR /build
COPY pyproject.toml README.md ./
COPY src/ src/
COPY streams/ streams/
RUN pip wheel --no-deps --wheel-dir /dist .

FROM deps AS runtime
LABEL org.opencontainers.image.title="rewardflow" \
      org.opencontainers.image.description="Self-hosted feedback and reward platform for real-time RL of coding agents" \
      org.opencontainers.image.licenses="Apache-2.0"
# REWARDFLOW_HOME (state, caches, the Faust worker's data directory worker-data/;
# also the working directory) belongs to the runtime user; mount a volume there to keep it.
RUN groupadd --system --gid 10001 rewardflow \
 && useradd --system --uid 10001 --gid rewardflow --home-dir /var/lib/rewardflow \
        --no-create-home --shell /usr/sbin/nologin rewardflow \
 && install -d -o rewardflow -g rewardflow -m 0750 /var/lib/rewardflow
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install --no-deps /tmp/dist/*.whl && pip check && rm -rf /tmp/dist
# The Avro schemas: found through REWARDFLOW_SCHEMA_DIR (the installed package is not
# next to a schemas/ directory).
COPY schemas/ /opt/rewardflow/schemas/
ENV REWARDFLOW_HOME=/var/lib/rewardflow \
    REWARDFLOW_SCHEMA_DIR=/opt/rewardflow/schemas
WORKDIR /var/lib/rewardflow
USER 10001:10001
# REWARDFLOW_WEB_PORT: the read endpoint (with chDB only); + 1: the worker's /metrics.
EXPOSE 16066 16067
# Alive = the worker's web server answers /metrics on REWARDFLOW_WEB_PORT + 1 (slim has
# no curl). Reads the port and host from the environment, not from REWARDFLOW_CONFIG_FILE.
# Only `rewardflow run` serves it: one-off commands may disable the check (compose does).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; h = os.environ.get('REWARDFLOW_WEB_HOST') or '127.0.0.1'; h = {'0.0.0.0': '127.0.0.1', '::': '::1'}.get(h, h); h = f'[{h}]' if ':' in h else h; p = int(os.environ.get('REWARDFLOW_WEB_PORT') or 16066) + 1; u.urlopen(f'http://{h}:{p}/metrics', timeout=4)"]
ENTRYPOINT ["rewardflow"]
CMD ["run"]
