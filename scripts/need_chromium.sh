#!/usr/bin/env bash
# Headless Chromium for the browser tests, the report's PDF and the screenshots: found (CHROMIUM=path, or
# chromium / chromium-browser / google-chrome on PATH), else installed with apt-get when this shell may (root,
# or password-less sudo), else exit 1 naming the command that installs it. pdftoppm (poppler-utils), which the
# PDF tests use to look at the report's pages, is checked the same way.
set -euo pipefail
INSTALL="sudo apt-get install -y chromium"
find_chromium() {
  for c in "${CHROMIUM:-}" chromium chromium-browser google-chrome google-chrome-stable; do
    if [ -n "$c" ] && command -v "$c" >/dev/null 2>&1; then command -v "$c"; return 0; fi
  done
  return 1
}
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO="none"; fi
fi
need_pdftoppm() {
  command -v pdftoppm >/dev/null 2>&1 && return 0
  if [ "$SUDO" != none ] && command -v apt-get >/dev/null 2>&1; then
    echo "pdftoppm: not found; installing poppler-utils with apt-get (the PDF tests need it)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq poppler-utils >/dev/null && return 0
  fi
  echo "pdftoppm is needed by the PDF tests and is not installed. Install it with:  sudo apt-get install -y poppler-utils" >&2
  return 1
}
if exe=$(find_chromium); then
  echo "chromium: $exe ($("$exe" --version 2>/dev/null || echo 'version unknown'))"
  need_pdftoppm
  exit 0
fi
if [ "$SUDO" != none ] && command -v apt-get >/dev/null 2>&1; then
  echo "chromium: not found; installing it with apt-get (the browser tests and the PDF need it)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  exe=$(find_chromium) || { echo "chromium: apt-get ran but no chromium on PATH; install it with: $INSTALL" >&2; exit 1; }
  echo "chromium: installed $exe"
  need_pdftoppm
  exit 0
fi
echo "chromium: headless Chromium is needed by the browser tests and the report's PDF, and is not installed." >&2
echo "Install it with:  $INSTALL   (or point CHROMIUM=/path/to/chrome at a Chrome / Chromium binary)" >&2
exit 1
