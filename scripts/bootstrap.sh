#!/usr/bin/env bash
# Makes sure the build dependencies of flashcl are installed (Debian/Ubuntu).
#
# Idempotent and quiet when nothing is missing. Missing packages are installed
# with apt-get as root, or through sudo when it exists; otherwise the exact
# install command is printed and the script exits non-zero.
#
# Used by scripts/bench.sh and scripts/test.sh; safe to run on its own.
set -euo pipefail

packages=(ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd libclblast-dev libcmocka-dev cmake)
command -v cc >/dev/null 2>&1 || packages+=(build-essential)
command -v make >/dev/null 2>&1 || packages+=(make)
# pkg-config: the CTest test install_check builds examples/forward.c with it.
command -v pkg-config >/dev/null 2>&1 || packages+=(pkg-config)

say() { printf 'bootstrap: %s\n' "$*" >&2; }

if ! command -v dpkg-query >/dev/null 2>&1; then
  say "not a Debian-based system (no dpkg-query): not checking packages."
  say "make sure these (or your distribution's equivalents) are installed: ${packages[*]}"
  exit 0
fi

is_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = "installed" ]
}

missing=()
for p in "${packages[@]}"; do
  is_installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  install_line="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    run=()
  elif command -v sudo >/dev/null 2>&1; then
    run=(sudo)
  else
    say "missing packages: ${missing[*]}"
    say "install them as root with:"
    printf '  %s\n' "$install_line" >&2
    exit 1
  fi
  say "installing missing packages: ${missing[*]}"
  # ${run[@]+...}: an empty array under set -u is an error in bash < 4.4
  if ! { ${run[@]+"${run[@]}"} apt-get update -qq &&
         ${run[@]+"${run[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
    say "installation failed; the install command is:"
    printf '  %s\n' "$install_line" >&2
    exit 1
  fi
  still=()
  for p in "${missing[@]}"; do
    is_installed "$p" || still+=("$p")
  done
  if [ "${#still[@]}" -gt 0 ]; then
    say "still missing after install: ${still[*]}"
    exit 1
  fi
fi

# An OpenCL driver registers itself with the ICD loader in /etc/OpenCL/vendors
# (or $OCL_ICD_VENDORS). Whether it exposes a device is reported by
# flashcl-info --check once the tools are built.
vendors="${OCL_ICD_VENDORS:-/etc/OpenCL/vendors}"
if [ -d "$vendors" ]; then
  if ! compgen -G "$vendors/*.icd" >/dev/null; then
    say "warning: no OpenCL driver registered in $vendors (pocl-opencl-icd provides one for CPUs)"
  fi
elif [ ! -f "$vendors" ]; then
  say "warning: $vendors does not exist: no OpenCL driver is registered"
fi
exit 0
