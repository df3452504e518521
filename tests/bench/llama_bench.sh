#!/usr/bin/env bash
# The Llama benchmark against PyTorch without a GPU (bench/exec_vs_torch/
# run_llama.sh, issue 35 item 6):
# 1. the PyTorch peer's model holds Partita's parameters: for every bundled
#    model, llama_shape.py's tensor list (what torch_llama.py builds and
#    checks its model against) counts what `partita estimate` states as
#    `parameters`, and so does torch_llama.py --count-only (the model
#    itself, on the meta device) where a python with torch 2 is here;
# 2. run_llama.sh with stand-ins for exec_bench, torch_llama.py and
#    nvidia-smi: both programs get one model file of the asked seq and
#    layers, "auto" takes the most layers Partita's estimate fits in the
#    GPU less the headroom and one fewer after an out-of-memory, and the
#    table holds the ratios and verdicts.
# Usage: llama_bench.sh PARTITA
set -u
partita=${1:?usage: llama_bench.sh PARTITA}
partita="$(cd "$(dirname "$partita")" && pwd)/$(basename "$partita")"
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
here="$root/bench/exec_vs_torch"
source "$root/tests/cli/lib.sh"
scratch_begin llama-bench

# 1. parameter counts
torch_python=""
for candidate in ${PYTHON:-} python3 /usr/bin/python3; do
    if "$candidate" -c 'import sys, torch
sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
        torch_python=$candidate
        break
    fi
done
# partita's counts (estimate exits 2 where a model does not fit one
# H200, and prints the estimate, parameters included, all the same);
# then one python (the machine may be slow to start one) compares
mkdir -p estimates
for model in "$root"/models/*.json; do
    printf '{ "model": "%s", "cluster": "%s", "gbs": 1, "mbs": 1, "tp": 1, "dp": 1, "pp": 1 }\n' \
        "$model" "$root/clusters/h200x1.json" >plan.json
    "$partita" estimate plan.json --json >"estimates/$(basename "$model")" 2>err.txt ||
        [ $? = 2 ] || { cat err.txt; fail "no estimate of $model"; }
done
cat >count_check.py <<'PY'
import glob, json, os, sys
sys.path.insert(0, sys.argv[1])
import llama_shape
with_torch = sys.argv[3] == "torch"
if with_torch:
    import torch, torch_llama
checked = 0
for path in sorted(glob.glob(sys.argv[2] + "/models/*.json")):
    estimate = json.load(open("estimates/" + os.path.basename(path)))
    ours = estimate["estimate"]["parameters"]
    shape = llama_shape.load(path)[1]
    spec = llama_shape.parameter_count(llama_shape.parameter_tensors(shape))
    if spec != ours:
        sys.exit(f"{path}: llama_shape.py counts {spec} parameters, partita {ours}")
    if with_torch:
        with torch.device("meta"):
            model = torch_llama.Model(shape)
        built = torch_llama.check_tensors(model, shape)
        if built != ours:
            sys.exit(f"{path}: torch_llama.py builds {built}, partita counts {ours}")
    checked += 1
if checked < 9:
    sys.exit(f"only {checked} bundled models")
print(f"# {checked} models: " + (
    f"the torch model (torch {torch.__version__}) holds partita's parameters"
    if with_torch else "llama_shape.py counts partita's parameters (no "
    "python with torch 2 here: the torch model is not built)"))
PY
if [ -n "$torch_python" ]; then
    run 0 "$torch_python" count_check.py "$here" "$root" torch
    cat out.txt
    # the command line of it, once
    run 0 "$torch_python" "$here/torch_llama.py" --model "$root/models/qwen2.5-7b.json" --count-only
    expect_in out.txt "PARAMETERS model=qwen2.5-7b parameters=7615616512 source=torch"
else
    run 0 python3 count_check.py "$here" "$root" spec
    cat out.txt
fi

# the overrides: a stack at another seq, named so
python3 "$here/llama_shape.py" "$root/models/llama3-8b.json" --seq 2048 --layers 8 \
    --write stack.json >out.txt || fail "llama_shape.py --write"
expect_in out.txt "model=llama3-8b-8l-s2048 parameters=2795573248 layers=8 seq=2048 "
python3 -c 'import json, sys
m = json.load(open("stack.json"))
sys.exit(not (m["seq"] == 2048 and m["layers"] == 8 and m["kv_heads"] == 8))' ||
    fail "stack.json: $(cat stack.json)"
printf '{ "model": "%s", "cluster": "%s", "gbs": 2, "mbs": 2, "tp": 1, "dp": 1, "pp": 1 }\n' \
    "$scratch/stack.json" "$root/clusters/h200x1.json" >stack-plan.json
run 0 "$partita" estimate --json stack-plan.json
expect_in out.txt '"parameters": 2795573248'
run 2 python3 "$here/llama_shape.py" "$root/models/llama3-8b.json" --layers 0
expect_in err.txt "layers: must be an integer >= 1"

# 2. run_llama.sh with stand-ins: exec_bench runs out of memory above
# FAKE_MAX_LAYERS and holds as many GiB as layers; torch.compile runs
# 100,000 tokens/s in 20 GiB; every call is written to calls.log
mkdir -p build/bench build/cli bin
ln -s "$partita" build/cli/partita
cat >build/bench/exec_bench <<'SH'
#!/usr/bin/env bash
layers=$(sed -n 's/^ *"layers": \([0-9]*\),*$/\1/p' "$1")
echo "partita $1 mbs $2" >>"$FAKE_LOG"
if [ "$layers" -gt "$FAKE_MAX_LAYERS" ]; then
    echo "exec_bench: cuda backend: cudaMalloc of 1.000 GiB for x failed: out of memory"
    exit 1
fi
echo "# stand-in exec_bench"
echo "RESULT impl=partita mode=cuda model=x mbs=$2 tokens_per_s=110000 step_ms=1.0 peak_gib=$layers.000 process_gib=1.0 grad_precision=fp32"
SH
cat >bin/python-stand-in <<'SH'
#!/usr/bin/env bash
case $1 in
*torch_llama.py)
    shift
    echo "torch $2 mbs $4 $*" >>"$FAKE_LOG"
    echo "# stand-in torch"
    echo "RESULT impl=torch mode=compile model=x mbs=$4 tokens_per_s=100000 step_ms=1.0 peak_gib=20.000 reserved_gib=21.0"
    exit 0 ;;
esac
exec python3 "$@"
SH
cat >bin/nvidia-smi <<'SH'
#!/usr/bin/env bash
case $* in
*memory.total*) echo 143771 ;;
*name*) echo "NVIDIA H200 (stand-in)" ;;
esac
SH
chmod +x build/bench/exec_bench bin/python-stand-in bin/nvidia-smi
export FAKE_LOG=$scratch/calls.log FAKE_MAX_LAYERS=28
run 0 env PATH="$scratch/bin:$PATH" PYTHON="$scratch/bin/python-stand-in" \
    CONFIGS="llama3.2-1b:4 llama3-8b:2:auto" WARMUP=1 STEPS=2 \
    bash "$here/run_llama.sh" build logs
# 29 layers is the most Partita's estimate fits in 140.40 - 2 GiB; 29 ran
# out of memory, 28 ran
expect_in err.txt "llama3-8b-29l-s2048, mbs 2: 29 layers, Partita's estimate 137.52 GiB within 138.40 GiB"
expect_in out.txt "out of memory: llama3-8b again with 28 layers"
expect_in out.txt "| llama3.2-1b | 16 | 2048 | 4 | 110000 | 100000 | \*\*1.100\*\* | 16.000 GiB | 20.000 GiB | 0.800 | PASS |"
expect_in out.txt "| llama3-8b | 28 | 2048 | 2 | 110000 | 100000 | \*\*1.100\*\* | 28.000 GiB | 20.000 GiB | 1.400 | FAIL |"
# the same file to both, at seq 2048; torch after Partita, not after its OOM
python3 - calls.log <<'PY' || fail "calls: $(cat calls.log)"
import json, sys
calls = [line.split() for line in open(sys.argv[1])]
sides = [(c[0], c[1]) for c in calls]
assert [s for s, _ in sides] == ["partita", "torch", "partita", "partita", "torch"], sides
assert sides[0][1] == sides[1][1] and sides[3][1] == sides[4][1], sides
for _, path in sides:
    model = json.load(open(path))
    assert model["seq"] == 2048, path
assert json.load(open(sides[3][1]))["layers"] == 28
assert json.load(open(sides[2][1]))["layers"] == 29
assert "--scope model" in " ".join(calls[1]) and "--residual fp32" in " ".join(calls[1])
PY
# ROUNDS=3: Partita and torch alternate three times; a side's tokens/s is
# the median of its rounds' (100,000, 130,000, 120,000: 120,000), its
# memory the largest
mkdir -p build3/bench build3/cli
ln -s "$partita" build3/cli/partita
cat >build3/bench/exec_bench <<'SH'
#!/usr/bin/env bash
echo "partita $1 mbs $2" >>"$FAKE_LOG"
n=$(grep -c '^partita' "$FAKE_LOG")
tps=(0 100000 130000 120000)
echo "RESULT impl=partita mode=cuda model=x mbs=$2 tokens_per_s=${tps[$n]} step_ms=1.0 peak_gib=1$n.000 process_gib=1.0 grad_precision=fp32"
SH
chmod +x build3/bench/exec_bench
: >"$FAKE_LOG"
run 0 env PATH="$scratch/bin:$PATH" PYTHON="$scratch/bin/python-stand-in" \
    CONFIGS="llama3.2-1b:4" ROUNDS=3 WARMUP=1 STEPS=2 bash "$here/run_llama.sh" build3 logs3
expect_in out.txt "| llama3.2-1b | 16 | 2048 | 4 | 120000 | 100000 | \*\*1.200\*\* | 13.000 GiB | 20.000 GiB | 0.650 | PASS |"
[ "$(cut -d' ' -f1 "$FAKE_LOG" | tr '\n' ' ')" = "partita torch partita torch partita torch " ] ||
    fail "ROUNDS=3 calls: $(cat "$FAKE_LOG")"
# a torch run that fails is a row without a ratio and exit status 1
cat >bin/python-stand-in <<'SH'
#!/usr/bin/env bash
case $1 in *torch_llama.py) echo "Traceback: something"; exit 1 ;; esac
exec python3 "$@"
SH
run 1 env PATH="$scratch/bin:$PATH" PYTHON="$scratch/bin/python-stand-in" \
    CONFIGS="llama3.2-1b:8" WARMUP=1 STEPS=2 bash "$here/run_llama.sh" build logs2
expect_in out.txt "| llama3.2-1b | 16 | 2048 | 8 | 110000 | failed | \*\*-\*\* |"
echo "PASS [$case_name]"
