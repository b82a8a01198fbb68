# syntax=docker/dockerfile:1.7
# The kvroute-sidecar image. Build from the repository root (BuildKit reads sidecar.Dockerfile.dockerignore):
#   docker build -f bundle/images/sidecar.Dockerfile -t ghcr.io/kvroute/kvroute-sidecar:0.1.0 .
# The binary is the same code as `kvroute sidecar`; the image carries only it.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kvroute-sidecar --bin kvroute-sidecar && cp target/release/kvroute-sidecar /kvroute-sidecar

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kvroute-sidecar /usr/local/bin/kvroute-sidecar
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvroute-sidecar"]
