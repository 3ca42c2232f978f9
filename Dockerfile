# One image for both servers; the command picks which:
#   docker run IMAGE                        the buyer server (the default command)
#   docker run IMAGE market-seller-server   the seller server
#   docker build --target sim ...           the same with the simulator's plots (the sim extra):
#   docker run SIM_IMAGE market-sim ...     the load simulator
# Settings come from the environment (every MARKET_* name is in .env.example). Every package
# comes from a lock file (requirements/*.txt: exact versions, each file's hash checked), so a
# build today installs what a build last month did; scripts/lock.sh refreshes the locks.
FROM python:3.11-slim AS app

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MARKET_HOST=0.0.0.0 \
    MARKET_METRICS_PORT=9100 \
    MARKET_LOG_FORMAT=json

RUN useradd --system --uid 10001 --user-group --home-dir /app --shell /usr/sbin/nologin market \
 && install -d -o market -g market /app /app/sim-results /app/tls

# docker-compose.yml's `tls` service: a certificate at first start (openssl comes with the image)
COPY deploy/tls/make-certs.sh /usr/local/bin/market-make-certs

# The dependencies first, from the lock alone, so that a code change reuses this layer.
COPY requirements/runtime.txt requirements/build.txt /src/requirements/
RUN pip install --require-hashes --no-deps -r /src/requirements/runtime.txt -r /src/requirements/build.txt

COPY . /src/
RUN pip install --no-deps --no-build-isolation /src && rm -rf /src

USER market
WORKDIR /app
EXPOSE 7001 7002

# Alive: the metrics port's /healthz over HTTP (on 127.0.0.1:9100 unless MARKET_METRICS_PORT
# says otherwise), whichever server runs and whether or not TLS is on. Orchestrators that route
# traffic probe /readyz (the database answers at the current schema, not stopping) instead.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('MARKET_METRICS_PORT', '9100'), timeout=4)"

CMD ["market-buyer-server"]

# The simulator's image (docker compose's `sim` service): the servers' image plus matplotlib
# and numpy, which the servers' image does not carry.
FROM app AS sim
USER root
COPY requirements/sim.txt /tmp/sim.txt
RUN pip install --require-hashes --no-deps -r /tmp/sim.txt && rm /tmp/sim.txt
USER market

# The default target, last: the servers' image.
FROM app AS server
