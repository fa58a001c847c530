#!/usr/bin/env bash
# Builds the uWebSockets echo (echo.cpp) into target/peers/uws-echo, from a uWebSockets
# checkout whose uSockets submodule is present: scripts/../peers/uwebsockets/build.sh DIR.
# It needs the sources from GitHub, so `freeboard bench` does not build it with the other peers;
# once built here, `--peers uwebsockets` runs it (or FREEBOARD_UWEBSOCKETS=DIR has the bench run
# this script on first use), and it can be run by hand and measured as a URL. Measured at
# uWebSockets 66dcff3 with uSockets 86097c4, g++ -O3 -flto, compression off, no TLS.
set -euo pipefail
uws=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=$here/../../target/peers
mkdir -p "$out"
make -C "$uws/uSockets" >/dev/null
g++ -std=c++20 -O3 -flto -DUWS_NO_ZLIB -I"$uws/src" -I"$uws/uSockets/src" \
    "$here/echo.cpp" "$uws"/uSockets/*.o -o "$out/uws-echo"
echo "$out/uws-echo PORT"
