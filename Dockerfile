# apns-relay container image: built on the official Swift image for Debian 12 (bookworm), run on
# debian:bookworm-slim with only the runtime libraries, as a non-root user, with a read-only root
# file system in mind (the relay writes nothing to disk). The test suite (scripts/test) runs on
# Debian 12 too: the build installs the same packages (scripts/build-packages.txt), and the
# runtime installs the runtime libraries of those packages (scripts/check-image-packages compares
# both releases and the package set with what the suite runs against).
#
# Base images are tags by default, so that any build works. A release pins both by digest and
# names its version, commit and source; with APNS_RELAY_VERSION given, the build refuses an
# unpinned base image, an unknown commit or source, a version other than VERSION's, and a checkout
# without the Package.resolved the suite ran with:
#   docker build \
#     --build-arg SWIFT_IMAGE=swift:6.3-bookworm@sha256:<digest> \
#     --build-arg RUNTIME_IMAGE=debian:bookworm-slim@sha256:<digest> \
#     --build-arg APNS_RELAY_VERSION="$(cat VERSION)" \
#     --build-arg APNS_RELAY_COMMIT="$(git rev-parse --short=12 HEAD)" \
#     --build-arg APNS_RELAY_SOURCE=https://git.example.com/push/apns-relay \
#     -t registry.example.com/apns-relay:"$(cat VERSION)" .
# (docs/development.md, "The container image").

ARG SWIFT_IMAGE=swift:6.3-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# The image's version label: "dev" for a build that is not a release.
ARG APNS_RELAY_VERSION=dev
# The image has no .git: `--build-arg APNS_RELAY_COMMIT=$(git rev-parse --short=12 HEAD)` names
# the commit that `apns-relay --version`, apns_relay_build_info and the revision label report.
ARG APNS_RELAY_COMMIT=unknown
# The repository's URL, for the source label.
ARG APNS_RELAY_SOURCE=""

FROM ${SWIFT_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/build-packages.txt /tmp/build-packages.txt
# Versions come with the base image's release; the list is shared with scripts/test.
# hadolint ignore=DL3008
RUN apt-get update \
    && grep -v '^#' /tmp/build-packages.txt | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ARG SWIFT_IMAGE
ARG RUNTIME_IMAGE
ARG APNS_RELAY_VERSION
ARG APNS_RELAY_COMMIT
ARG APNS_RELAY_SOURCE
# Package.resolved, when the checkout has one (it stays out of git): the Swift packages' versions
# the suite built and ran here, rather than the newest ones Package.swift allows.
COPY Package.swift Package.resolved* VERSION ./
# A release build: both base images pinned by digest, the version VERSION's, commit and source
# named, and the Swift packages' versions those the suite ran with.
RUN if [ "${APNS_RELAY_VERSION}" != dev ]; then \
        failed=""; \
        refuse() { echo "release build: $*" >&2; failed=1; }; \
        for image in "${SWIFT_IMAGE}" "${RUNTIME_IMAGE}"; do \
            case "$image" in *@sha256:*) ;; *) refuse "base image $image is not pinned by digest (IMAGE:TAG@sha256:DIGEST)" ;; esac; \
        done; \
        [ "${APNS_RELAY_VERSION}" = "$(tr -d ' \t\r\n' < VERSION)" ] || refuse "APNS_RELAY_VERSION ${APNS_RELAY_VERSION} is not VERSION's $(cat VERSION)"; \
        [ "${APNS_RELAY_COMMIT}" != unknown ] || refuse "APNS_RELAY_COMMIT is not given"; \
        [ -n "${APNS_RELAY_SOURCE}" ] || refuse "APNS_RELAY_SOURCE is not given"; \
        [ -f Package.resolved ] || refuse "no Package.resolved: build in the checkout scripts/test ran in"; \
        [ -z "$failed" ] || exit 1; \
    fi
COPY Plugins ./Plugins
COPY scripts/build-info ./scripts/build-info
COPY Sources ./Sources
COPY Tests ./Tests
RUN APNS_RELAY_COMMIT="${APNS_RELAY_COMMIT}" swift build -c release --product apns-relay --static-swift-stdlib \
    && install -D -m 0755 "$(swift build -c release --show-bin-path)/apns-relay" /out/apns-relay

FROM ${RUNTIME_IMAGE} AS runtime
# The runtime libraries of scripts/build-packages.txt's -dev packages, as Debian 12 names them
# (scripts/check-image-packages), and the CA certificates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends librdkafka1 libnghttp2-14 libhiredis0.14 libjemalloc2 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin apns-relay
COPY --from=build /out/apns-relay /usr/local/bin/apns-relay
COPY config/apns-relay.yaml /etc/apns-relay/apns-relay.yaml
ARG RUNTIME_IMAGE
ARG APNS_RELAY_VERSION
ARG APNS_RELAY_COMMIT
ARG APNS_RELAY_SOURCE
LABEL org.opencontainers.image.title="apns-relay" \
      org.opencontainers.image.description="Delivers Apple push notifications from Kafka intents, with one outcome per intent back to Kafka." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${APNS_RELAY_VERSION}" \
      org.opencontainers.image.revision="${APNS_RELAY_COMMIT}" \
      org.opencontainers.image.source="${APNS_RELAY_SOURCE}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/apns-relay"]
CMD ["run", "--config", "/etc/apns-relay/apns-relay.yaml"]

# Smoke test: the binary starts, its libraries resolve in the runtime image, and jemalloc starts
# with the arenas the binary compiles in (CAllocatorSettings; its statistics go to stderr).
FROM runtime AS smoke
RUN /usr/local/bin/apns-relay --help > /dev/null && /usr/local/bin/apns-relay --version \
    && MALLOC_CONF=stats_print:true /usr/local/bin/apns-relay --version 2> /tmp/jemalloc-stats > /dev/null \
    && grep -q "opt.narenas: 2" /tmp/jemalloc-stats

# The default target: the runtime image, built only after the smoke test passed.
FROM runtime
COPY --from=smoke /usr/local/bin/apns-relay /usr/local/bin/apns-relay
