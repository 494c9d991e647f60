#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs libtorch into .venv once (idempotent;
# a second run does not reinstall), checks formatting and lints (rustfmt, then clippy on
# every target with warnings as errors), then runs every test of the workspace.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install Rust (https://rustup.rs)" >&2
  exit 2
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked "$@"
