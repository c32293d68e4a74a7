#!/usr/bin/env bash
# Installs the real components the suite drives, so `make test` on a fresh machine runs the
# same suite as CI: the pinned Claude Code CLI (npm, into the user's cache, reused while the
# pinned version is there) and a headless Chromium (Debian's package where apt-get runs as
# root; otherwise Playwright's own `install chromium`, which works on a normal machine).
# Each step that cannot run here says why and goes on: the suite then names the tests it
# skipped and this command at its end.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV_BIN="${VENV_BIN:-.venv/bin}"

CLAUDE_CODE_VERSION=2.1.332
CLAUDE_CODE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/evalloop/claude-code"
claude="$CLAUDE_CODE_DIR/node_modules/.bin/claude"
if ! command -v npm >/dev/null 2>&1; then
    echo "real components: npm not found; the real-CLI tests will be skipped" >&2
elif [ "$("$claude" --version 2>/dev/null | cut -d' ' -f1)" != "$CLAUDE_CODE_VERSION" ]; then
    mkdir -p "$CLAUDE_CODE_DIR"
    npm install --prefix "$CLAUDE_CODE_DIR" --no-audit --no-fund --loglevel=error \
        "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >&2 \
        || echo "real components: npm could not install @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >&2
fi

# The malloy target's npm tree (the real Malloy compiler, DuckDB, the MCP SDK), from its lock
# file into ~/.cache/evalloop/malloy-server/<sha of the lock>: the same call the plugin makes on
# first use (ensure_server), so the tests use what this installed.
if ! command -v npm >/dev/null 2>&1; then
    echo "real components: npm not found; the malloy target tests will be skipped" >&2
elif ! "$VENV_BIN/python" -c 'from pytest_evalloop.targets.malloy.install import ensure_server; ensure_server()' >&2; then
    echo "real components: could not install the malloy server's npm tree" >&2
fi

if [ ! -x /usr/bin/chromium ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2 \
            || echo "real components: apt-get could not install chromium" >&2
    elif [ -x "$VENV_BIN/playwright" ]; then
        "$VENV_BIN/playwright" install chromium >&2 \
            || echo "real components: playwright could not install its chromium" >&2
    else
        echo "real components: no chromium (apt-get as root, or make setup for playwright)" >&2
    fi
fi
exit 0
