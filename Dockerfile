# syntax=docker/dockerfile:1
#
# One image recipe for both binaries. Build from the repository root:
#
#   docker build --target ccm-operator -t ghcr.io/ccm-rs/ccm-operator:0.1.0 .
#   docker build --target cloud-controller-manager -t ghcr.io/ccm-rs/cloud-controller-manager:0.1.0 .
#
# Both images carry both binaries (they share every layer but the entrypoint); the operator's
# Deployments run `cloud-controller-manager` from the manager image by name.

ARG RUST_VERSION=1.95

# Builder: the whole workspace, release profile, with the committed Cargo.lock.
FROM rust:${RUST_VERSION}-bookworm AS builder
# The built-in providers (ccm-builtin's features), given to both binaries in one cargo build, so
# they share one compiled provider list. The default leaves out `fake`, the in-memory test cloud;
# an image for tests may add it:
#   docker build --build-arg PROVIDERS=fake,baremetal,aws ...
ARG PROVIDERS=baremetal,aws
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds; the binaries are copied out
# because the target cache mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p operator -p cloud-controller-manager \
      --bin ccm-operator --bin cloud-controller-manager \
      --no-default-features --features "${PROVIDERS}" \
 && mkdir -p /out \
 && cp target/release/ccm-operator target/release/cloud-controller-manager /out/

# Runtime: distroless with glibc and CA certificates only; no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=builder /out/ccm-operator /out/cloud-controller-manager /usr/local/bin/
# The distroless "nonroot" user, numeric so runAsNonRoot can verify it.
USER 65532:65532

# BIRD for spec.announcer.bgp (the chart's announcer.birdImage): Debian's bird2 and the shell
# the sidecar waits for its config with. The pod sets the user (the announcer's).
#   docker build --target bird -t ghcr.io/ccm-rs/bird:2 .
FROM debian:bookworm-slim AS bird
RUN apt-get update \
 && apt-get install -y --no-install-recommends bird2 \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["bird"]

FROM runtime AS cloud-controller-manager
# Upstream's secure port: /healthz, /livez, /readyz and /metrics.
EXPOSE 10258
ENTRYPOINT ["/usr/local/bin/cloud-controller-manager"]

# The default target.
FROM runtime AS ccm-operator
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/ccm-operator"]
