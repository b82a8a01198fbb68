# syntax=docker/dockerfile:1.7
# The kvroute-operator image. Build from the repository root (BuildKit reads operator.Dockerfile.dockerignore):
#   docker build -f bundle/images/operator.Dockerfile -t ghcr.io/kvroute/kvroute-operator:0.1.0 .
# The binary is the same code as `kvroute operator`; the image carries only it.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kvroute-operator --bin kvroute-operator && cp target/release/kvroute-operator /kvroute-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kvroute-operator /usr/local/bin/kvroute-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvroute-operator"]
