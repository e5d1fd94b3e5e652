# apns-relay container image: built on the official Swift image for Ubuntu 24.04, run on a slim
# Ubuntu 24.04 with only the runtime libraries, as a non-root user, with a read-only root file
# system in mind (the relay writes nothing to disk). The build installs the same Debian/Ubuntu
# packages as scripts/test (scripts/build-packages.txt).

ARG SWIFT_IMAGE=swift:6.3-noble
ARG RUNTIME_IMAGE=ubuntu:24.04

FROM ${SWIFT_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/build-packages.txt /tmp/build-packages.txt
# Versions come with the base image's release; the list is shared with scripts/test.
# hadolint ignore=DL3008
RUN apt-get update \
    && grep -v '^#' /tmp/build-packages.txt | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The image has no .git: `--build-arg APNS_RELAY_COMMIT=$(git rev-parse --short=12 HEAD)` names
# the commit that `apns-relay --version` and relay_build_info report (else "unknown").
ARG APNS_RELAY_COMMIT=unknown
COPY Package.swift VERSION ./
COPY Plugins ./Plugins
COPY scripts/build-info ./scripts/build-info
COPY Sources ./Sources
COPY Tests ./Tests
RUN APNS_RELAY_COMMIT="${APNS_RELAY_COMMIT}" swift build -c release --product apns-relay --static-swift-stdlib \
    && install -D -m 0755 "$(swift build -c release --show-bin-path)/apns-relay" /out/apns-relay

FROM ${RUNTIME_IMAGE} AS runtime
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends librdkafka1 libnghttp2-14 libhiredis1.1.0 libjemalloc2 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin apns-relay
COPY --from=build /out/apns-relay /usr/local/bin/apns-relay
COPY config/apns-relay.yaml /etc/apns-relay/apns-relay.yaml
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/apns-relay"]
CMD ["run", "--config", "/etc/apns-relay/apns-relay.yaml"]

# Smoke test: the binary starts and its libraries resolve in the runtime image.
FROM runtime AS smoke
RUN /usr/local/bin/apns-relay --help > /dev/null && /usr/local/bin/apns-relay --version

# The default target: the runtime image, built only after the smoke test passed.
FROM runtime
COPY --from=smoke /usr/local/bin/apns-relay /usr/local/bin/apns-relay
