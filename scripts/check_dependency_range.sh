#!/bin/sh
# Install the provider twice into fresh virtualenvs, with the lowest and with the highest versions
# setup.cfg allows, and run scripts/smoke_test_install.py in each (a throwaway PostgreSQL is started;
# initdb must be on PATH or in /usr/lib/postgresql/*/bin).
#   scripts/check_dependency_range.sh [workdir]
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
python=${PYTHON:-python3.11}
for bound in lowest highest; do
    "$python" -m venv "$work/venv-$bound"
    if [ "$bound" = lowest ]; then
        "$work/venv-$bound/bin/pip" install -q -c "$repo/scripts/lowest-constraints.txt" "$repo"
    else
        "$work/venv-$bound/bin/pip" install -q --upgrade "$repo"
    fi
    (cd "$work" && PATH="$work/venv-$bound/bin:$PATH" "$work/venv-$bound/bin/python" "$repo/scripts/smoke_test_install.py")
    echo "$bound: ok"
done
