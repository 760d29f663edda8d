# Sourced by the sweep scripts before anything else. Bash reads a script while it runs it, so an
# edit to a sweep script in the middle of a sweep would change, or break, the rest of that sweep.
# This runs the script again from a private copy, which the copy removes once it is open. The
# copy finds the repository through SWEEP_ROOT. Each script starts with:
#   [ "$0" = "${SWEEP_SNAPSHOT:-}" ] || . "$(dirname "$0")/_snapshot.sh"
#   cd "$SWEEP_ROOT" && rm -f "$SWEEP_SNAPSHOT"
SWEEP_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SWEEP_SNAPSHOT=$(mktemp "${TMPDIR:-/tmp}/sweep.XXXXXX")
cp "$0" "$SWEEP_SNAPSHOT"
export SWEEP_ROOT SWEEP_SNAPSHOT
exec bash "$SWEEP_SNAPSHOT" "$@"
