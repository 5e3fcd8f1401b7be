#!/usr/bin/env bash
# Lints the GitHub workflows with actionlint (the pinned release, built with Go through the
# module proxy into $GPULAB_CACHE/bin/actionlint-<version>), which also runs shellcheck
# (Debian's) over every `run:` script. Then shellcheck over the project's own scripts.
set -euo pipefail
cd "$(dirname "$0")/.."
source clusters/infra/nodeimage/lib.sh

if ! command -v shellcheck >/dev/null; then
  log "actionlint: installing shellcheck"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends shellcheck >/dev/null ||
    die "actionlint: cannot install shellcheck"
fi

bin=$GPULAB_CACHE/bin/actionlint-$ACTIONLINT_VERSION
if [[ ! -x $bin/actionlint ]]; then
  command -v go >/dev/null || die "actionlint: no Go toolchain to build $ACTIONLINT_VERSION"
  log "actionlint: building github.com/rhysd/actionlint@$ACTIONLINT_VERSION (about 1 min cold)"
  tmp=$(fresh_tmp "$bin")
  GOBIN=$tmp nice -n 10 go install -trimpath -ldflags=-s \
    "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" >&2 ||
    die "actionlint: go install failed"
  publish_dir "$tmp" "$bin"
fi

# This repository's workflows (the one that runs `uses: ./` makes actionlint check
# action.yml's inputs too) and the example of a plugin repository's.
workflows=(.github/workflows/*.yml examples/*/.github/workflows/*.yml)
"$bin/actionlint" -shellcheck=shellcheck "${workflows[@]}"
# Every shell script of ours, at warning level (style notes are not failures).
mapfile -t scripts < <(git ls-files '*.sh' .ci/run clusters/infra/nodeimage/files/usr/local/bin/entrypoint)
shellcheck -x -S warning "${scripts[@]}"
# action.yml's run: scripts, which actionlint does not shellcheck (it checks only the
# inputs a workflow passes to it), as ci/run-action.py resolves them.
[[ -x .venv/bin/python ]] || die "actionlint: no .venv to read action.yml with; run make install"
steps=$(mktemp -d)
trap 'rm -rf "$steps"' EXIT
.venv/bin/python ci/run-action.py --input subject=subject.yaml --scripts "$steps"
shellcheck -S warning "$steps"/*.sh
echo "actionlint $ACTIONLINT_VERSION + shellcheck: ${#scripts[@]} scripts, ${#workflows[@]} workflow(s) and action.yml clean" >&2
