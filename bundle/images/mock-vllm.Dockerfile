# syntax=docker/dockerfile:1.7
# The kvroute-mock-vllm image. Build from the repository root (BuildKit reads mock-vllm.Dockerfile.dockerignore):
#   docker build -f bundle/images/mock-vllm.Dockerfile -t ghcr.io/kvroute/kvroute-mock-vllm:0.1.0 .
# The binary is the same code as `kvroute mock-vllm`; the image carries only it.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kvroute-mock-vllm --bin kvroute-mock-vllm && cp target/release/kvroute-mock-vllm /kvroute-mock-vllm

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kvroute-mock-vllm /usr/local/bin/kvroute-mock-vllm
# Tokenizer files for vLLM-identical tokenization (Qwen3); mount more under /opt/kvroute/tokenizers.
COPY --from=build /src/testdata/tokenizers /opt/kvroute/tokenizers
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvroute-mock-vllm"]
