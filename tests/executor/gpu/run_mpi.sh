#!/usr/bin/env bash
# One process per GPU under mpirun on the 2- and 4-GPU machines (issue
# 4's launch, issue 38's item 3), against the threads launch of the same
# plans. The machine has
# no Open MPI: it runs the copy bundle_mpi.sh made (BUNDLE_DIR, carried
# with the build). Logs and run.json files go to LOG_DIR; a summary comes
# last. A few minutes.
#
#   0. the bundled mpirun on the cpu backend: a tiny pp = 2 plan as two
#      processes, its losses against the threads launch's (same bits);
#   1. `partita exec --backend cuda` of a small GPT (6 layers, hidden 256,
#      seq 256) for ITERS iterations as pp = 2 (1F1B, 4-2), dp = 2, tp = 2,
#      the interleaved pp = 2 (2 chunks a rank), dp = 2 with ZeRO-2 and
#      with ZeRO-3, and pp = 2 on a whole GPU and one limited to 40 SMs
#      (a heterogeneous pair), and where 4 GPUs are visible pp = 4, dp =
#      4, tp = 4, tp 2 x pp 2, dp 2 x tp 2, dp 4 with ZeRO-3 and pp = 4
#      over two whole GPUs and two of 40 SMs (issue 38, item 3), each as
#      threads of one process and as one process a rank under mpirun
#      (NCCL communicators from ids broadcast over MPI): losses within
#      2e-3 at iteration 1 and 2e-2 after (the sums' order differs), and
#      the processes' run.json holds every rank's events and devices;
#   2. a pp = 2 checkpoint saved by 2 processes, resumed by the threads
#      launch, against the straight threads run (1e-4);
#   3. rank 1 killed mid-run: the job ends within 60 s, naming rank 1;
#   4. 3 processes for a 2-rank plan: refused by every process.
#
# Usage: tests/executor/gpu/run_mpi.sh BUILD_DIR BUNDLE_DIR [LOG_DIR]
#   BUILD_DIR   a meson build with -Dcuda=enabled, NCCL and MPI found
#               (build-mpi-cuda)
#   BUNDLE_DIR  Open MPI copied by bundle_mpi.sh (its env.sh is sourced),
#               or "system" for the mpirun on PATH
# Environment: ITERS (30); ROW_LIMIT_S (240): a row still running then is
# killed and fails (tests/executor/gpu/gpu_rows.sh); each row says what
# it waits on, and the last line is "run_mpi.sh: PASS" or "...: FAIL".
# Exit status 0 when every check passed, else 1.
set -u
build=$(cd "${1:?usage: run_mpi.sh BUILD_DIR BUNDLE_DIR [LOG_DIR]}" && pwd)
bundle=${2:?usage: run_mpi.sh BUILD_DIR BUNDLE_DIR [LOG_DIR]}
logs=${3:-$build/gpu-mpi-logs}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
partita="$build/cli/partita"
checks="$here/parallel_checks.py"
iters=${ITERS:-30}
mkdir -p "$logs/plans"
logs=$(cd "$logs" && pwd)
export PARTITA_SOURCE="$root"
export NCCL_NVLS_ENABLE=0
# losses compared bit for bit: cuDNN's deterministic attention backward
export PARTITA_CUDA_DETERMINISTIC=1
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "$bundle" != system ]; then
    # shellcheck source=/dev/null
    source "$(cd "$bundle" && pwd)/env.sh"
fi
command -v mpirun >/dev/null || { echo "FAIL no mpirun (BUNDLE_DIR?)"; exit 1; }
mpirun --version | head -1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { # N ARGS...: partita as N processes (the row's limit ends it)
    local count=$1; shift
    mpirun --oversubscribe -np "$count" "$partita" "$@"
}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
    | tee "$logs/nvidia-smi.txt"
gpu_type=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 |
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /[0-9]/) { print $i; exit } }')

# shellcheck source=tests/executor/gpu/gpu_rows.sh
source "$here/gpu_rows.sh"
# step NAME COMMAND...: one row (gpu_rows.sh), killed after ROW_LIMIT_S
# seconds (240)
row_limit=${ROW_LIMIT_S:-240}
step() {
    local name=$1; shift
    gpu_row "$name" "$row_limit" "$@"
}
# expect_failure NAME LIMIT_S PATTERN COMMAND...: must fail within
# LIMIT_S, its output matching PATTERN (killed 30 s after the limit)
expect_failure() {
    local name=$1 limit=$2 pattern=$3; shift 3
    local log="$logs/$name.log" start=$SECONDS
    echo "== $name: waiting on: $* (to fail within $limit s, log $log)"
    gpu_limited $((limit + 30)) "$@" >"$log" 2>&1
    local rc=$? took=$((SECONDS - start))
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le "$limit" ] &&
        grep -q -- "$pattern" "$log"; then
        gpu_note "$name" PASS "failed as it should in $took s ($log)"
    else
        tail -8 "$log"
        gpu_note "$name" FAIL "exit $rc after $took s, '$pattern' expected ($log)"
    fi
}
every_rank() { # RUN_JSON RANKS: both ranks' events and devices recorded
    python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); ranks = int(sys.argv[2])
events = {e["rank"] for e in run["events"]}
devices = [d.get("name") for d in run["devices"]]
ok = events == set(range(ranks)) and len(devices) == ranks
print(("PASS" if ok else "FAIL") + f" {sys.argv[1]}: events of ranks "
      f"{sorted(events)}, devices {devices}")
sys.exit(0 if ok else 1)
PY
}

data="$logs/corpus"
"$partita" prep "$root/data/corpus.txt" -o "$data" >"$logs/prep.log" 2>&1 ||
    { echo "FAIL partita prep"; cat "$logs/prep.log"; exit 1; }

# ------------------------------------------------ 0. the bundle, on cpu
echo "# cpu: pp 2 tiny plan, threads against 2 processes"
cat >"$logs/plans/tiny-pp2.json" <<JSON
{ "model": { "name": "tiny", "layers": 4, "hidden": 16, "heads": 2,
             "seq": 16, "vocab": 257 },
  "cluster": { "name": "one-box", "nodes": [
      { "name": "box", "gpu": "A100-FASOP", "gpus": 2,
        "intra_node": { "bandwidth_GBps": 230, "latency_us": 5 } } ] },
  "gbs": 4, "mbs": 1, "tp": 1, "dp": 1, "pp": 2, "partition": "3-1" }
JSON
step cpu-threads "$partita" exec "$logs/plans/tiny-pp2.json" --data "$data" \
    --iters 4 -o "$logs/cpu-threads.run.json"
step cpu-mpi mpi 2 exec "$logs/plans/tiny-pp2.json" --data "$data" \
    --iters 4 -o "$logs/cpu-mpi.run.json" &&
    step cpu-losses python3 "$checks" losses "$logs/cpu-threads.run.json" \
        "$logs/cpu-mpi.run.json" cpu-pp2 1e-6 1e-5

if [ "$gpus" -lt 2 ]; then
    gpu_note gpu-part SKIP "needs 2 GPUs, $gpus visible"
    gpu_summary run_mpi.sh
fi

# -------------------------------------------- 1. cuda: threads vs mpirun
link='"intra_node": { "bandwidth_GBps": 300, "latency_us": 5 },
      "inter_node": { "bandwidth_GBps": 300, "latency_us": 5 }'
two_gpus="{ \"name\": \"two\", \"nodes\": [ { \"name\": \"box\", \"gpu\": \"$gpu_type\", \"gpus\": 2, $link, \"devices\": [ { \"index\": 0 }, { \"index\": 1 } ] } ] }"
small='{ "name": "small", "layers": 6, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "seq": 256, "vocab": 257 }'
# cluster NAME DEVICES...: one box of as many GPUs as devices, each
# device "INDEX" (whole) or "INDEX:40" (40 SMs, 48 GiB)
cluster() {
    local name=$1 list="" device; shift
    for device in "$@"; do
        list="$list${list:+, }{ \"index\": ${device%%:*}"
        [ "$device" != "${device%%:*}" ] &&
            list="$list, \"sm_limit\": ${device##*:}, \"memory_limit_gib\": 48"
        list="$list }"
    done
    echo "{ \"name\": \"$name\", \"nodes\": [ { \"name\": \"box\", \"gpu\": \"$gpu_type\", \"gpus\": $#, $link, \"devices\": [ $list ] } ] }"
}
two_hetero=$(cluster two-hetero 0 1:40)
four_gpus=$(cluster four 0 1 2 3)
four_hetero=$(cluster four-hetero 0 1 2:40 3:40)
plan() { # NAME "tp dp pp" [PARTITION [MORE_FIELDS [CLUSTER]]]
    local extra="" cluster=${5:-$two_gpus}
    [ -n "${3:-}" ] && extra=", \"partition\": \"$3\""
    [ -n "${4:-}" ] && extra="$extra, $4"
    read -r tp dp pp <<<"$2"
    cat >"$logs/plans/$1.json" <<JSON
{ "model": $small, "cluster": $cluster, "gbs": 16, "mbs": 2,
  "tp": $tp, "dp": $dp, "pp": $pp, "precision": "bf16"$extra }
JSON
}
plan pp2 "1 1 2" 4-2
plan dp2 "1 2 1"
plan tp2 "2 1 1"
plan pp2-interleaved "1 1 2" 4-2 '"virtual_stages": 2'
plan dp2-zero2 "1 2 1" "" '"distributed_optimizer": true, "zero": 2'
plan dp2-zero3 "1 2 1" "" '"distributed_optimizer": true, "zero": 3'
plan pp2-hetero "1 1 2" 2-4 "" "$two_hetero"
rows="pp2:2 dp2:2 tp2:2 pp2-interleaved:2 dp2-zero2:2 dp2-zero3:2 pp2-hetero:2"
if [ "$gpus" -ge 4 ]; then
    plan pp4 "1 1 4" 2-2-1-1 "" "$four_gpus"
    plan dp4 "1 4 1" "" "" "$four_gpus"
    plan tp4 "4 1 1" "" "" "$four_gpus"
    plan tp2-pp2 "2 1 2" 4-2 "" "$four_gpus"
    plan dp2-tp2 "2 2 1" "" "" "$four_gpus"
    plan dp4-zero3 "1 4 1" "" '"distributed_optimizer": true, "zero": 3' "$four_gpus"
    plan pp4-hetero "1 1 4" 2-2-1-1 "" "$four_hetero"
    rows="$rows pp4:4 dp4:4 tp4:4 tp2-pp2:4 dp2-tp2:4 dp4-zero3:4 pp4-hetero:4"
fi
cuda=(--backend cuda --log-interval 10 --comm-timeout 120)

echo "# cuda: $rows (name:processes) as threads and as processes ($iters iterations)"
for row in $rows; do
    name=${row%%:*} ranks=${row##*:}
    step "threads-$name" "$partita" exec "$logs/plans/$name.json" \
        --data "$data" "${cuda[@]}" --iters "$iters" \
        -o "$logs/threads-$name.run.json" || continue
    step "mpi-$name" mpi "$ranks" exec "$logs/plans/$name.json" \
        --data "$data" "${cuda[@]}" --iters "$iters" \
        -o "$logs/mpi-$name.run.json" || continue
    step "losses-$name" python3 "$checks" losses \
        "$logs/threads-$name.run.json" "$logs/mpi-$name.run.json" \
        "mpi-$name" 2e-3 2e-2
    step "ranks-$name" every_rank "$logs/mpi-$name.run.json" "$ranks"
done

# -------------------------------------------------- 2. checkpoint, cuda
echo "# pp 2: 3 iterations as 2 processes, resumed to 6 as threads"
constant_lr=(--lr 3e-4 --min-lr 3e-4 --warmup 0)
rm -rf "$logs/ckpt"
step straight "$partita" exec "$logs/plans/pp2.json" --data "$data" \
    "${cuda[@]}" --iters 6 "${constant_lr[@]}" -o "$logs/straight.run.json"
step mpi-first-half mpi 2 exec "$logs/plans/pp2.json" --data "$data" \
    "${cuda[@]}" --iters 3 "${constant_lr[@]}" --save "$logs/ckpt" \
    -o "$logs/first-half.run.json" &&
step resumed "$partita" exec "$logs/plans/pp2.json" --data "$data" \
    "${cuda[@]}" --iters 6 "${constant_lr[@]}" --load "$logs/ckpt" \
    -o "$logs/resumed.run.json" &&
step resume python3 "$checks" resume "$logs/straight.run.json" \
    "$logs/resumed.run.json" 1e-4

# ------------------------------------------------------ 3. a killed rank
echo "# rank 1 killed mid-run"
kill_rank_1() {
    mpi 2 exec "$logs/plans/pp2.json" --data "$data" --backend cuda \
        --log-interval 1 --comm-timeout 20 --iters 1000000 \
        -o "$logs/killed.run.json" &
    local job=$! pid="" process
    # after the first log line (this function's output is the log), the
    # process whose MPI rank is 1
    for _ in $(seq 600); do
        grep -q '^iteration' "$logs/rank-killed.log" 2>/dev/null && break
        sleep 0.2
    done
    for process in $(pgrep -f -- "$partita exec"); do
        tr '\0' '\n' <"/proc/$process/environ" 2>/dev/null |
            grep -qx OMPI_COMM_WORLD_RANK=1 && pid=$process
    done
    echo "# SIGKILL to the second process, pid ${pid:-none found}"
    [ -n "$pid" ] && kill -9 "$pid"
    wait "$job"
}
expect_failure rank-killed 60 "rank 1" kill_rank_1
[ -e "$logs/killed.run.json" ] && gpu_note killed-record FAIL "a failed run wrote run.json"

# --------------------------------------------------- 4. process count
expect_failure size-mismatch 60 "3 processes were started" \
    mpi 3 exec "$logs/plans/pp2.json" --data "$data" "${cuda[@]}" --iters 2 \
    -o "$logs/mismatch.run.json"

gpu_summary run_mpi.sh
