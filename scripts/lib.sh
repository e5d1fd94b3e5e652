# Shared by scripts/test and scripts/demo: installs the Debian packages the build and the tests
# need, when they are missing.
set -euo pipefail

APT_PACKAGES=(pkg-config openssl libnghttp2-dev libhiredis-dev librdkafka-dev nghttp2-client redis-server)

ensure_packages() {
    local missing=()
    for package in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    if ((${#missing[@]})); then
        echo "installing: ${missing[*]}" >&2
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}
