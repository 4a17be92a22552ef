#!/usr/bin/env bash
# `sam build` as a user runs it, with the repository's samconfig.toml (cached = false,
# parallel = true): the artifact users deploy by default (arm64), and the traps that
# cfn-lint and `sam validate` cannot see:
#
#   arm64         template.yaml as it is (Globals: Architectures arm64: what `sam build &&
#                 sam deploy --guided` ships) must give aarch64 executables, cross-compiled
#                 by cargo-lambda with zig (the venv's ziglang); scripts/test.sh then runs
#                 them under qemu-aarch64-static.
#   x86_64        the template with that one line changed to x86_64 (what docs/deploy.md
#                 tells users without zig to do) must give x86-64 executables.
#   deploy        the built template (what `sam deploy` and `sam deploy --guided` read)
#                 must name the architecture of its bootstraps as a literal and have no
#                 parameter that could change it: a deploy-time Architecture=x86_64 once
#                 shipped an arm64 executable on an x86_64 function.
#   build again   a second sam build with nothing changed must give the same bootstraps
#                 (cargo's incremental build is the cache; SAM's is off, because its
#                 checksum of CodeUri, the workspace root, walks target/ and .git).
#
# Usage: scripts/sam_build_check.sh OUT_DIR
#   OUT_DIR/build        the x86-64 bootstraps of the working tree (RelayFunction/bootstrap,
#                        ...), which the later steps of scripts/test.sh run natively;
#   OUT_DIR/build-arm64  the arm64 bootstraps of the working tree (the default artifact).
#
# Cost: every build runs in a copy of the working tree at a fixed path under the cache
# (tree/; a file is rewritten only when its content changed) with the shared
# CARGO_TARGET_DIR, so cargo rebuilds only what changed in the working tree since the
# last run, once per architecture (nothing: seconds; a change under lib/: ~5 min each
# on 2 cores; the arm64 build from scratch, with the host's build scripts and proc
# macros already built by the x86-64 build: ~10.5 min).  Builds into the
# shared target directory take $CACHE/sam-build.lock: every sam build of the machine
# writes the same $CARGO_TARGET_DIR/lambda/<binary>/bootstrap, from which SAM copies,
# and two at once (another clone's, or the other architecture) could copy each other's.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
export SAM_CLI_TELEMETRY=0
WORK=${SAM_BUILD_CHECK_DIR:-$CACHE/sam-build-check}
OUT=${1:?usage: scripts/sam_build_check.sh OUT_DIR}
mkdir -p "$WORK" "$OUT"
OUT=$(cd "$OUT" && pwd)

fail() { echo "sam build check FAILED: $*" >&2; exit 1; }

exec 8>"$CACHE/sam-build.lock"
if ! flock -n 8; then
    echo "--- another sam build holds $CACHE/sam-build.lock; waiting"
    flock 8
fi

# Checks that $1/{RelayFunction,EnqueueFunction}/bootstrap are ELF executables of the
# machine $2 (62 x86-64, 183 aarch64; e_machine at offset 18) and prints their sizes.
check_elf() { # $1: build directory, $2: e_machine, $3: its name, $4: what went wrong
    local fn bootstrap magic machine
    for fn in "${FUNCTIONS[@]}"; do
        bootstrap=$1/$fn/bootstrap
        [[ -x $bootstrap ]] || fail "sam build made no executable $bootstrap"
        magic=$(od -An -tx1 -N4 "$bootstrap" | tr -d ' \n')
        machine=$(od -An -tu2 -j18 -N2 "$bootstrap" | tr -d ' \n')
        [[ $magic == 7f454c46 && $machine == "$2" ]] ||
            fail "$bootstrap is not an $3 ELF executable (magic $magic, machine $machine): $4"
        echo "$fn/bootstrap: $3 ELF, $(($(stat -c %s "$bootstrap") / 1024)) KiB"
    done
}
FUNCTIONS=(RelayFunction EnqueueFunction)

# Makes $2 a copy of the tree $1 (no .git, no build output): a file is rewritten only
# when its content differs, so cargo's mtime-based freshness stays exact and cheap.  The
# optional $3 (a path in the tree) is left to the caller.
sync_tree() {
    local src=$1 dst=$2 skip=${3:-} rel list
    mkdir -p "$dst"
    list=$(mktemp)
    (cd "$src" && find . \( -name .git -o -name .aws-sam -o -name target -o -name __pycache__ \
        -o -path ./fuzz/corpus -o -path ./fuzz/artifacts \) -prune -o -type f -print) | sort >"$list"
    while IFS= read -r rel; do
        [[ $rel == "./$skip" ]] && continue
        if ! cmp -s "$src/$rel" "$dst/$rel"; then
            mkdir -p "$(dirname "$dst/$rel")"
            cp "$src/$rel" "$dst/$rel"
        fi
    done <"$list"
    # Files gone from the tree go from the copy too.
    (cd "$dst" && find . -type f -print) | sort | comm -13 "$list" - | while IFS= read -r rel; do
        rm -f "$dst/$rel"
    done
    rm -f "$list"
}

# One copy of the working tree, at a fixed path (cargo's fingerprints of the workspace's
# crates name their paths: the same path keeps them fresh between runs).
tree=$WORK/tree
x86_template=template.x86_64.yaml
sync_tree "$ROOT" "$tree"
[[ ! -e $ROOT/$x86_template ]] || fail "$x86_template exists in the working tree; it is this check's"
# The template as a user without zig edits it: the Globals' architecture line only.
sed 's/^      - arm64$/      - x86_64/' "$tree/template.yaml" >"$tree/$x86_template"
cmp -s "$tree/template.yaml" "$tree/$x86_template" &&
    fail "template.yaml has no Globals line '      - arm64' under Architectures to change"
trap 'rm -f "$tree/$x86_template"' EXIT

build() { # $1: template, $2: build directory
    (cd "$tree" && sam build --config-file "$ROOT/samconfig.toml" --template "$1" \
        --build-dir "$2")
}

# The built template names the machine of its bootstraps as a literal, and no parameter
# can change it at deploy time.
check_built_template() { # $1: build directory, $2: architecture
    python3 - "$1/template.yaml" "$2" <<'PY' || fail "$1/template.yaml: see above"
import sys
from samtranslator.yaml_helper import yaml_parse
path, arch = sys.argv[1], sys.argv[2]
with open(path) as f:
    t = yaml_parse(f.read())
problems = []
if "Architecture" in t.get("Parameters", {}):
    problems.append("has a parameter Architecture: a deploy-time answer could change it")
globals_arch = t.get("Globals", {}).get("Function", {}).get("Architectures")
for name, r in t["Resources"].items():
    if r["Type"] != "AWS::Serverless::Function":
        continue
    arch_of = r.get("Properties", {}).get("Architectures", globals_arch)
    if arch_of != [arch]:
        problems.append(f"{name}: Architectures is {arch_of!r}, its bootstrap is {arch}")
for p in problems:
    print(f"{path}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
    echo "$1/template.yaml: both functions are $2 (a literal; no parameter changes it)"
}

started=$SECONDS
echo "--- sam build of the working tree, the template's architecture line set to x86_64"
build "$x86_template" "$OUT/build"
check_elf "$OUT/build" 62 x86-64 "sam build did not take the template's Architectures"
check_built_template "$OUT/build" x86_64
echo "($((SECONDS - started)) s)"

# Nothing changed: cargo compiles nothing and SAM copies the same executables.
keep=$(mktemp -d)
for fn in "${FUNCTIONS[@]}"; do cp "$OUT/build/$fn/bootstrap" "$keep/$fn"; done
started=$SECONDS
echo "--- sam build again, nothing changed"
build "$x86_template" "$OUT/build"
for fn in "${FUNCTIONS[@]}"; do
    cmp -s "$keep/$fn" "$OUT/build/$fn/bootstrap" ||
        fail "$fn: a second sam build with nothing changed made another bootstrap"
done
rm -rf "$keep"
echo "both bootstraps as before ($((SECONDS - started)) s)"

# The default artifact: template.yaml as it is.
started=$SECONDS
echo "--- sam build of the working tree (template.yaml as it is: arm64)"
build template.yaml "$OUT/build-arm64"
check_elf "$OUT/build-arm64" 183 aarch64 "sam build did not build the template's default architecture"
check_built_template "$OUT/build-arm64" arm64
echo "($((SECONDS - started)) s)"
echo "sam build check passed"
