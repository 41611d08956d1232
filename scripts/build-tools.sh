# Sourced by the scripts that build Granary: makes `cmake` and `nasm` available to the build.
#
# turbojpeg-sys compiles libjpeg-turbo 3.1 from source with its SIMD code, and that needs CMake
# and the NASM assembler. Neither ships with Rust or Python, and Debian's libjpeg-turbo (2.1) is
# too old to link instead (Granary uses the TurboJPEG 3 API). So, when they are not on PATH
# already, this puts both in a folder of their own, without touching the system:
#   - CMake from its PyPI wheel (a self-contained binary), with `python3 -m pip`;
#   - NASM from Debian's package (`apt-get download` and `dpkg-deb -x`: no root needed unless the
#     package lists are empty, in which case it runs `apt-get update`, through sudo when not root).
# The folder is $GRANARY_CACHE_DIR/build-tools (default ~/.cache/granary/build-tools); a second
# run finds it and does nothing. On a machine without apt, install nasm and cmake yourself.

granary_build_tools() {
  local dir="${GRANARY_CACHE_DIR:-$HOME/.cache/granary}/build-tools"
  local cmake_version=3.31.6 need=()
  command -v cmake >/dev/null 2>&1 || need+=(cmake)
  command -v nasm >/dev/null 2>&1 || need+=(nasm)
  [ ${#need[@]} -gt 0 ] || return 0
  mkdir -p "$dir/bin"
  export PATH="$dir/bin:$PATH"
  if [[ " ${need[*]} " == *" cmake "* ]] && ! [ -x "$dir/bin/cmake" ]; then
    printf '== installing cmake %s from PyPI into %s (libjpeg-turbo builds with it)\n' "$cmake_version" "$dir" >&2
    if ! python3 -m pip --version >/dev/null 2>&1; then
      printf 'granary: building needs cmake: install it (apt-get install cmake) or pip (apt-get install python3-pip)\n' >&2
      return 1
    fi
    rm -rf "$dir/cmake"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --only-binary=:all: \
      --target "$dir/cmake" "cmake==$cmake_version" || return 1
    ln -sf "$dir/cmake/cmake/data/bin/cmake" "$dir/bin/cmake"
  fi
  if [[ " ${need[*]} " == *" nasm "* ]] && ! [ -x "$dir/bin/nasm" ]; then
    printf '== installing nasm from Debian'"'"'s package into %s (libjpeg-turbo'"'"'s SIMD code is NASM)\n' "$dir" >&2
    if ! command -v apt-get >/dev/null 2>&1; then
      printf 'granary: building needs nasm (the x86 assembler): install it with your package manager\n' >&2
      return 1
    fi
    local tmp sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd=sudo
    tmp=$(mktemp -d)
    if ! (cd "$tmp" && apt-get download nasm >/dev/null 2>&1); then
      $sudo_cmd apt-get update -q >/dev/null || { rm -rf "$tmp"; return 1; }
      (cd "$tmp" && apt-get download nasm >/dev/null) || { rm -rf "$tmp"; return 1; }
    fi
    rm -rf "$dir/nasm"
    dpkg-deb -x "$tmp"/nasm_*.deb "$dir/nasm" || { rm -rf "$tmp"; return 1; }
    rm -rf "$tmp"
    ln -sf "$dir/nasm/usr/bin/nasm" "$dir/bin/nasm"
  fi
}

granary_build_tools || { printf 'granary: could not provide cmake and nasm for the build (see above)\n' >&2; exit 1; }
