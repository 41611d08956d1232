# The granary image: one static-ish binary that serves both `granary operator` (the Helm chart in
# charts/granary runs it) and `granary worker` (the operator starts workers from the same image).
#
#   docker build -t ghcr.io/granary-dev/granary:0.1.0 .
#
# And its Python variant, for the workers of pipelines with `python.map` stages (the chart's
# `workers.pythonImage`, by default this name): the same binary beside Python 3.11 and NumPy.
#
#   docker build --target python -t ghcr.io/granary-dev/granary-python:0.1.0 .

# Build stage. cmake and nasm: turbojpeg-sys compiles libjpeg-turbo with its SIMD code.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake nasm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p granary-cli \
 && install -D -m 0755 target/release/granary /out/granary

# The Python variant (`--target python`): Debian 12 like the build stage (the binary needs only
# its glibc and libgcc), Python 3.11 and NumPy, which is all the stage runner needs; users' own
# packages go in images built FROM this one (examples/python-stage/Dockerfile). NumPy is pinned
# to the version the tests run (worker/tests/fixtures/python/requirements.txt). The workers find
# the interpreter through GRANARY_PYTHON. Runs as the nonroot user (uid/gid 65532), like the
# default image. No bytecode is written: worker pods have a read-only root filesystem.
FROM python:3.11-slim-bookworm AS python
ARG NUMPY_VERSION=2.2.6
RUN pip install --no-cache-dir --disable-pip-version-check --only-binary=:all: "numpy==${NUMPY_VERSION}" \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=build /out/granary /usr/local/bin/granary
ENV GRANARY_PYTHON=/usr/local/bin/python3 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 7070 7071 9090
ENTRYPOINT ["/usr/local/bin/granary"]

# Runtime stage, the default (last) target: glibc, libgcc and CA certificates, nothing else; runs
# as the nonroot user (uid/gid 65532), which the chart's securityContext expects.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/granary /usr/local/bin/granary
USER 65532:65532
EXPOSE 7070 7071 9090
ENTRYPOINT ["/usr/local/bin/granary"]
