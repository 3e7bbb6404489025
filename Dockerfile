# The one Chronotope image: `chronotope operator | scheduler | device-plugin | ...`.
#
#   docker build -t chronotope:dev .                      # on the official python:3.11-slim
#   hack/image.sh                                         # without a registry (docs/install.md)
#
# BASE_IMAGE is any Debian-like image with Python >= 3.11 and its venv module as
# `python3` on PATH: python:3.11-slim (/usr/local/bin/python3) or the Debian
# bookworm base that hack/image.sh makes with debootstrap (/usr/bin/python3).
# Every stage uses the same base, so the venv's interpreter link stays valid.
# Written for the classic builder too (no RUN --mount, no heredocs).
#
# Stages: `deps` (a venv with the runtime dependencies from pyproject.toml, not the
# `dev` extra) -> `venv` (the same without pip) and `app` (`pip install .` of the
# package, beside the venv) -> the final image. The package and the dependencies
# are separate layers, so a change to the code rebuilds and ships only the package.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS deps
# PEM certificates pip should trust besides its own bundle: a TLS-intercepting proxy
# between the build and PyPI (hack/image.sh passes the host's local CAs). Build
# stages only; the final image never sees them.
ARG EXTRA_CA_CERTS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/opt/pip-ca.pem \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml ./
# --no-compile: bytecode would add ~100 MB (the kubernetes client's models) and
# ~40 s to a cold build, to save ~4 s at each process start. The packages' own
# test suites (pandas' alone is 18 MB) are dropped. The .pth file puts the
# package (installed by `app` into /opt/chronotope/lib) on the venv's path.
RUN python3 -m venv /opt/venv \
    && cat "$(/opt/venv/bin/python -c 'import pip._vendor.certifi as c; print(c.where())')" \
        > "$PIP_CERT" \
    && printf '%s\n' "$EXTRA_CA_CERTS" >> "$PIP_CERT" \
    && python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && /opt/venv/bin/pip install --quiet --no-compile -r /tmp/requirements.txt \
    && find /opt/venv/lib -depth -type d -name tests -exec rm -rf {} + \
    && echo /opt/chronotope/lib \
        > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/chronotope.pth"

FROM deps AS venv
RUN /opt/venv/bin/pip uninstall --quiet --yes pip setuptools

FROM deps AS app
# README.md is the package's long description (hatchling needs it), so it comes
# with the code: an edit to it never reinstalls the dependencies
COPY README.md ./
COPY operator/chronotope operator/chronotope
# `pip install .` builds the wheel (hatchling, fetched into pip's isolated build
# env); `pip check` then sees the package's requirements met by the venv.
RUN /opt/venv/bin/pip install --quiet --no-compile --no-deps --target /opt/chronotope/lib . \
    && mv /opt/chronotope/lib/bin /opt/chronotope/bin \
    && /opt/venv/bin/pip check \
    && /opt/chronotope/bin/chronotope --help >/dev/null

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="chronotope" \
      org.opencontainers.image.description="Chronotope operator, scheduler extender and device plugin" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it without /etc/passwd.
RUN groupadd --system --gid 10001 chronotope \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/chronotope --create-home \
        --shell /usr/sbin/nologin chronotope
ENV PATH=/opt/chronotope/bin:/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CHRONOTOPE_DATA_DIR=/opt/chronotope/data
COPY --from=venv /opt/venv /opt/venv
# The shipped data the simulators read (data/README.md); the components read no files.
COPY data /opt/chronotope/data
COPY --from=app /opt/chronotope /opt/chronotope
USER 10001:10001
WORKDIR /home/chronotope
ENTRYPOINT ["/opt/chronotope/bin/chronotope"]
CMD ["--help"]
