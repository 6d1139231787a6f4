#!/usr/bin/env bash
# Builds the example policy in every language (or the ones named) into
# policy-examples/build/deadline-scaler-LANG.wasm. A language whose toolchain is not
# installed is skipped with the reason; any other failure fails the script.
#
#   bash policy-examples/build.sh                 # rust python js zig
#   bash policy-examples/build.sh python zig
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
languages=("$@")
[ ${#languages[@]} -gt 0 ] || languages=(rust python js zig)
failed=0
for language in "${languages[@]}"; do
    bash "$here/$language/build.sh"
    status=$?
    case $status in
        0) ;;
        3) echo "skipped $language: its toolchain is not installed" >&2 ;;
        *) echo "error: building the $language example failed (exit $status)" >&2; failed=1 ;;
    esac
done
exit $failed
