# shellcheck shell=bash
# Sourced by the GPU test scripts (run_all.sh, run_parallel.sh,
# run_mpi.sh, run_devcomm.sh, run_multi_gpu.sh): one row is one command
# under a hard time limit, its output in LOG_DIR/NAME.log, announced
# before it starts with what the script now waits on, and ended by one
# line "PASS|FAIL|SKIP NAME: ..."; gpu_summary closes a script with every
# row and one last line "SCRIPT: PASS" or "SCRIPT: FAIL". So a script
# that hangs is a FAIL row that names itself, never a call that runs out.
#
# The caller sets `logs` (the log folder) before the first row.
# shellcheck disable=SC2154

gpu_status=0
gpu_rows=()

# gpu_limited LIMIT_S COMMAND...: runs COMMAND (a program or a shell
# function) in a process group of its own; after LIMIT_S seconds the
# group gets SIGTERM, 10 s later SIGKILL. Returns its status, 124 when
# it was killed for the limit.
gpu_limited() {
    local limit=$1; shift
    local marker
    marker=$(mktemp)
    rm -f "$marker"
    set -m # background jobs in their own process groups
    "$@" &
    local pid=$!
    (
        sleep "$limit"
        touch "$marker"
        kill -TERM -- "-$pid" 2>/dev/null
        sleep 10
        kill -KILL -- "-$pid" 2>/dev/null
    ) >/dev/null 2>&1 &
    local watchdog=$!
    set +m
    wait "$pid"
    local rc=$?
    kill -TERM -- "-$watchdog" 2>/dev/null
    wait "$watchdog" 2>/dev/null
    if [ -e "$marker" ]; then
        rm -f "$marker"
        return 124
    fi
    return $rc
}

# gpu_note NAME VERDICT TEXT: a row decided by the caller.
gpu_note() {
    echo "$2 $1: $3"
    gpu_rows+=("$(printf '%-34s %-4s %s' "$1" "$2" "$3")")
    [ "$2" = FAIL ] && gpu_status=1
    return 0
}

# gpu_row NAME LIMIT_S COMMAND...: one row; exit 77 is a skip. Returns 0
# when the row passed or was skipped, else 1.
gpu_row() {
    local name=$1 limit=$2; shift 2
    local log="$logs/$name.log" start=$SECONDS
    echo "== $name: waiting on: $* (at most $limit s, log $log)"
    gpu_limited "$limit" "$@" >"$log" 2>&1
    local rc=$? took=$((SECONDS - start))
    grep -E '^(FAIL|SKIP|NOTE|#|ALL|SOME|exec:|partita exec:)' "$log" |
        tail -30
    if [ $rc -eq 0 ]; then
        gpu_note "$name" PASS "$took s ($log)"
    elif [ $rc -eq 77 ]; then
        gpu_note "$name" SKIP "$took s ($log)"
    elif [ $rc -eq 124 ]; then
        tail -5 "$log"
        gpu_note "$name" FAIL "still running after $limit s: killed ($log)"
    else
        tail -5 "$log"
        gpu_note "$name" FAIL "exit $rc after $took s ($log)"
    fi
    [ $rc -eq 0 ] || [ $rc -eq 77 ]
}

# gpu_summary SCRIPT: every row, then the script's verdict; exits with 0
# when no row failed.
gpu_summary() {
    echo
    echo "Summary of $1 (logs in $logs, $SECONDS s in all):"
    local line
    for line in "${gpu_rows[@]}"; do echo "  $line"; done
    local failed=0
    for line in "${gpu_rows[@]}"; do
        [[ "$line" =~ ^[^\ ]+\ +FAIL ]] && failed=$((failed + 1))
    done
    if [ $gpu_status -eq 0 ]; then
        echo "$1: PASS (${#gpu_rows[@]} rows)"
    else
        echo "$1: FAIL ($failed of ${#gpu_rows[@]} rows failed)"
    fi
    exit $gpu_status
}
