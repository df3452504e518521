# Helpers shared by the command-line tests (e2e.sh, mpi.sh), sourced
# after they set case_name and changed into their scratch folder.

fail() { echo "FAIL [$case_name]: $*"; exit 1; }
# run EXPECTED_STATUS CMD...: runs, keeps output in out.txt / err.txt
run() {
  local expected="$1"; shift
  "$@" >out.txt 2>err.txt
  local status=$?
  if [ "$status" != "$expected" ]; then
    echo "--- stdout"; cat out.txt; echo "--- stderr"; cat err.txt
    fail "'$*' exited $status, expected $expected"
  fi
}
expect_in() { grep -q -- "$2" "$1" || { cat "$1"; fail "'$2' not in $1"; }; }

# A 4-layer tiny model on one node of tp x dp x pp "gpus"; EXTRA adds
# plan fields (', "partition": "3-1"').
write_layout_plan() { # FILE MBS TP DP PP [EXTRA]
  local gpus=$(( $3 * $4 * $5 ))
  cat >"$1" <<JSON
{ "model": { "name": "tiny", "layers": 4, "hidden": 16, "heads": 2,
             "seq": 16, "vocab": 257 },
  "cluster": { "name": "one-box", "nodes": [
      { "name": "box", "gpu": "A100-FASOP", "gpus": $gpus,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 } } ] },
  "gbs": 4, "mbs": $2, "tp": $3, "dp": $4, "pp": $5${6:-} }
JSON
}
