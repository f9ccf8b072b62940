# The ttft-exporter image the Helm chart runs (image ttft-exporter:<version>, see README.md):
#   docker build -t ttft-exporter:0.1.0 .
# The package and its runtime dependencies only (no SDKs, no demo, no generator: `ttft-exporter
# generate` needs the `generate` extra and runs where the repository is, not in this image);
# non-root, as the chart's podSecurityContext expects (uid 65532). `ttft-exporter` is the
# entrypoint: the chart passes `serve --config /etc/ttft-exporter/ttft-exporter.yaml`.
#
# The base image is pinned by digest (a tag moves under a rebuild; a digest is the same bytes).
# The digest is the multi-platform index of python:3.11-slim. To update it, on a machine with
# Docker and Docker Hub access:
#   docker buildx imagetools inspect python:3.11-slim --format '{{json .Manifest.Digest}}'
# (or `docker pull python:3.11-slim && docker inspect --format '{{index .RepoDigests 0}}'
# python:3.11-slim`), replace the sha256 below, rebuild, and run the image's HEALTHCHECK.
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

LABEL org.opencontainers.image.title="ttft-exporter" \
      org.opencontainers.image.description="TTFT, stalls and call phases of LLM calls for Prometheus" \
      org.opencontainers.image.source="https://github.com/ttft-exporter/ttft-exporter" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Every dependency at the exact version and hash of requirements-image.txt (written from
# pyproject.toml's ranges by `make image-requirements`), setuptools, the build backend,
# included; then the package itself, built with those, nothing else fetched.
COPY requirements-image.txt ./
RUN pip install --no-compile --require-hashes --no-deps -r requirements-image.txt
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip install --no-compile --no-deps --no-build-isolation --no-index . && rm -rf /src

USER 65532:65532
WORKDIR /
EXPOSE 9469
# For `docker run` and Compose (Kubernetes ignores it: the chart's probes call /healthz). The
# image has no curl: Python's urllib, on the default port over plain HTTP.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9469/healthz', timeout=4)"]
ENTRYPOINT ["ttft-exporter"]
# Beyond loopback `serve` refuses to start without a push token: give it the token your workers
# send, e.g. `docker run -e TTFT_EXPORTER_PUSH_TOKEN=... -p 9469:9469 ttft-exporter:0.1.0`, or a
# config naming aggregator.push_token_file (a Compose secret under /run/secrets/), read again
# when it changes. (aggregator.allow_unauthenticated_push: true opens /push to anyone.)
CMD ["serve", "--addr", "0.0.0.0"]
