# The granary image: one static-ish binary that serves both `granary operator` (the Helm chart in
# charts/granary runs it) and `granary worker` (the operator starts workers from the same image).
#
#   docker build -t ghcr.io/granary-dev/granary:0.1.0 .

# Build stage. cmake and nasm: turbojpeg-sys compiles libjpeg-turbo with its SIMD code.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake nasm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p granary-cli \
 && install -D -m 0755 target/release/granary /out/granary

# Runtime stage: glibc, libgcc and CA certificates, nothing else; runs as the nonroot user
# (uid/gid 65532), which the chart's securityContext expects.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/granary /usr/local/bin/granary
USER 65532:65532
EXPOSE 7070 7071 9090
ENTRYPOINT ["/usr/local/bin/granary"]
