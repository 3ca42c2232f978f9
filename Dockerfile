# One image for both servers; the command picks which:
#   docker run IMAGE                        the buyer server (the default command)
#   docker run IMAGE market-seller-server   the seller server
#   docker run IMAGE market-sim ...         the load simulator
# Settings come from the environment (every MARKET_* name is in .env.example).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MARKET_HOST=0.0.0.0

RUN useradd --system --uid 10001 --user-group --home-dir /app --shell /usr/sbin/nologin market \
 && install -d -o market -g market /app /app/sim-results

# The dependencies first, read from pyproject.toml alone, so that a code change reuses this layer.
COPY pyproject.toml /src/
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY . /src/
RUN pip install --no-deps /src && rm -rf /src

USER market
WORKDIR /app
EXPOSE 7001 7002

# The image does not know which server it runs: whichever port answers the protocol's ping.
# docker-compose.yml and the systemd units check the one server they started.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD market health "127.0.0.1:${MARKET_BUYER_PORT:-7001}" || market health "127.0.0.1:${MARKET_SELLER_PORT:-7002}"

CMD ["market-buyer-server"]
