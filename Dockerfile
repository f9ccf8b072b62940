# The ttft-exporter image the Helm chart runs (image ttft-exporter:<version>, see README.md):
#   docker build -t ttft-exporter:0.1.0 .
# The package and its runtime dependencies only (no SDKs, no demo); non-root, as the chart's
# podSecurityContext expects (uid 65532). `ttft-exporter` is the entrypoint: the chart passes
# `serve --config /etc/ttft-exporter/ttft-exporter.yaml`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip install --no-compile . && rm -rf /src

USER 65532:65532
WORKDIR /
EXPOSE 9469
ENTRYPOINT ["ttft-exporter"]
CMD ["serve", "--addr", "0.0.0.0"]
