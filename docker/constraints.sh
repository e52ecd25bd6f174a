#!/usr/bin/env sh
# Write docker/constraints.txt again from a real install: the project and its build backend
# installed into a fresh virtual environment in the Dockerfile's base image, then every installed
# package pinned. Run it from the repository root (a Docker engine needed) after changing the
# dependencies in pyproject.toml, and commit the result with that change.
#
#   docker/constraints.sh
set -eu
image=$(sed -n 's/^ARG PYTHON_IMAGE=//p' docker/Dockerfile)
{
    echo "# Every package of the image and of its build, pinned (the Dockerfile's PIP_CONSTRAINT)."
    echo "# Written by docker/constraints.sh from an install in $image; do not edit by hand."
    docker run --rm -v "$PWD:/src:ro" "$image" sh -c \
        'python -m venv /tmp/v >&2 && /tmp/v/bin/pip install -q --disable-pip-version-check hatchling /src >&2 \
         && /tmp/v/bin/pip freeze --exclude acp-fault-proxy --exclude pip --exclude setuptools --exclude wheel'
} > docker/constraints.txt.new
mv docker/constraints.txt.new docker/constraints.txt
echo "docker/constraints.txt: $(grep -c '==' docker/constraints.txt) packages pinned" >&2
