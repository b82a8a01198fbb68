# syntax=docker/dockerfile:1.7
# The kvroute-router image. Build from the repository root (BuildKit reads router.Dockerfile.dockerignore):
#   docker build -f bundle/images/router.Dockerfile -t ghcr.io/kvroute/kvroute-router:0.1.0 .
# The binary is the same code as `kvroute router`; the image carries only it.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kvroute-router --bin kvroute-router && cp target/release/kvroute-router /kvroute-router

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kvroute-router /usr/local/bin/kvroute-router
# Tokenizer files for vLLM-identical tokenization (Qwen3); mount more under /opt/kvroute/tokenizers.
COPY --from=build /src/testdata/tokenizers /opt/kvroute/tokenizers
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvroute-router"]
