# Helpers shared by the command-line tests (e2e.sh, exec_report.sh,
# zero.sh, mpi.sh, plan_options.sh, asymmetric.sh) and the benchmarks'
# (tests/bench/llama_bench.sh, plan_quality.sh, which begin with
# scratch_begin): e2e.sh and zero.sh source it first and begin with
# e2e_begin, mpi.sh after it set case_name and changed into its scratch
# folder.

fail() { echo "FAIL [$case_name]: $*"; exit 1; }

# e2e_begin PARTITA CASE: what e2e.sh and zero.sh start with: partita
# (run under PARTITA_WRAPPER when set), case_name, source_root, and a
# scratch folder to work in, removed at exit.
e2e_begin() {
  partita_binary="$1"
  case_name="$2"
  source_root="${PARTITA_SOURCE:?PARTITA_SOURCE must be set}"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cd "$work" || exit 1
}
# scratch_begin CASE: how the benchmarks' tests (tests/bench) start: the
# case's name for fail(), python3 or a skip (77), then a scratch folder
# ($scratch) to work in, removed at exit.
scratch_begin() {
  case_name="$1"
  command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cd "$scratch" || exit 1
}
partita() { ${PARTITA_WRAPPER:-} "$partita_binary" "$@"; }
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
# run_profile CMD...: `run 0 CMD` for a cpu-backend `partita profile`,
# run again (at most three times) when the profile's own reader refused
# the measurement as inconsistent: timing on a loaded machine, not the
# code under test, can make a larger micro-batch look faster.
run_profile() {
  local attempt
  for attempt in 1 2 3; do
    "$@" >out.txt 2>err.txt && return 0
    grep -q "inconsistent" err.txt || break
    echo "note [$case_name]: attempt $attempt refused as inconsistent, again" >&2
  done
  echo "--- stdout"; cat out.txt; echo "--- stderr"; cat err.txt
  fail "'$*' failed"
}
expect_in() { grep -q -- "$2" "$1" || { cat "$1"; fail "'$2' not in $1"; }; }

# A pool of 2 A100 and 2 A10 nodes of 4 GPUs, priced: in-pool.json.
write_small_pool() {
  cat >in-pool.json <<JSON
{ "name": "small-pool",
  "nodes": [
    { "name": "a100", "count": 2, "gpu": "A100-FASOP", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 },
      "inter_node": { "bandwidth_Gbps": 40, "latency_us": 20 },
      "price_per_hour": 32.7726 },
    { "name": "a10", "count": 2, "gpu": "A10-FASOP", "gpus": 4,
      "intra_node": { "bandwidth_GBps": 16, "latency_us": 10 },
      "inter_node": { "bandwidth_Gbps": 40, "latency_us": 20 },
      "price_per_hour": 8.144 } ] }
JSON
}

# A 4-layer tiny model on one node of tp x dp x pp "gpus"; EXTRA adds
# plan fields (', "partition": "3-1"').
write_layout_plan() { # FILE MBS TP DP PP [EXTRA]
  write_gpus_plan "$1" $(( $3 * $4 * $5 )) "$2" "$3" "$4" "$5" "${6:-}"
}

# The same on a node of GPUS "gpus": a plan whose stages run their own
# tp and dp (EXTRA ', "stages": [...]') holds their tp x dp summed.
write_gpus_plan() { # FILE GPUS MBS TP DP PP [EXTRA]
  cat >"$1" <<JSON
{ "model": { "name": "tiny", "layers": 4, "hidden": 16, "heads": 2,
             "seq": 16, "vocab": 257 },
  "cluster": { "name": "one-box", "nodes": [
      { "name": "box", "gpu": "A100-FASOP", "gpus": $2,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 } } ] },
  "gbs": 4, "mbs": $3, "tp": $4, "dp": $5, "pp": $6${7:-} }
JSON
}

# The lm loss column of exec's log lines, one per iteration.
losses() { grep -o 'lm loss: [^ ]*' "$1" | awk '{print $3}'; }

# Two runs' losses within fp32 round-off (1e-5 relative): another
# layout, or MPI, sums in its own order.
same_losses() { # LOG LOG
  losses "$1" >first.losses; losses "$2" >second.losses
  [ -s first.losses ] || fail "no loss in $1"
  paste first.losses second.losses | awk '
    NF != 2 { bad = 1 }
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1) + 1e-6) bad = 1 }
    END { exit bad }' || { paste first.losses second.losses; fail "losses differ"; }
}

no_leftovers() {
  local left
  left=$(ls -A | grep -v -e '^out.txt$' -e '^err.txt$' -e '^in' || true)
  [ -z "$left" ] || fail "files left behind: $left"
}

# exec: the bundled corpus prepped as in-corpus, and a tiny plan of one
# stage on one device (model and cluster inline) with the given pp/vocab.
prep_corpus() {
  partita prep "$source_root/data/corpus.txt" -o in-corpus >/dev/null \
    || fail "prep of the corpus failed"
}

write_tiny_plan() { # FILE [PP] [VOCAB]
  local pp="${2:-1}" vocab="${3:-257}"
  cat >"$1" <<JSON
{ "model": { "name": "tiny", "layers": 2, "hidden": 16, "heads": 2,
             "seq": 16, "vocab": $vocab },
  "cluster": { "name": "one-box", "nodes": [
      { "name": "box", "gpu": "A100-FASOP", "gpus": $pp,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 } } ] },
  "gbs": 4, "mbs": 2, "tp": 1, "dp": 1, "pp": $pp }
JSON
}
