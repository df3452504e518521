#!/usr/bin/env bash
# bench/kernel_trace/kernel_table.py without a GPU: two synthetic traces
# (start_ns end_ns device stream launch name, as kernel_trace.c writes
# them) of four steps each, cut at the embedding's forward: the table by
# kind and its ratio column, --by-name's rows (a namespaced cuDNN kernel
# named in full, its ms a step and us a call), a trace without a
# training step refused with its path, an argument without its label
# refused.
# Usage: kernel_table.sh
set -u
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin kernel-table
table="$root/bench/kernel_trace/kernel_table.py"
# write_trace FILE SCALE: four steps, every kernel's time times SCALE
write_trace() {
    python3 - "$1" "$2" <<'PY'
import sys
path, scale = sys.argv[1], float(sys.argv[2])
kernels = [("_Z24embedding_forward_kernelPv", 30),
           ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 150),
           ("_ZN5cudnn6fusion9matmul_dqILb1ELi64EEEvPKv", 150),
           ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", 270),
           ("_Z12adamw_kernelPfS_i", 2500)]
rows, t = ["start_ns\tend_ns\tdevice\tstream\tlaunch\tname"], 0
for step in range(4):
    for name, us in kernels:
        ns = int(us * scale * 1000)
        rows.append(f"{t}\t{t + ns}\t0\t7\t-\t{name}")
        t += ns + 2000
open(path, "w").write("\n".join(rows) + "\n")
PY
}
write_trace a.tsv 1.0
write_trace b.tsv 1.1
echo '{"hidden": 64, "layers": 2, "seq": 16, "vocab": 100, "heads": 2}' >m.json
run 0 python3 "$table" --model m.json --mbs 1 --warmup 1 --by-name A=a.tsv B=b.tsv
expect_in out.txt "| attention | 0.42 |"
expect_in out.txt "| matrix products |"
expect_in out.txt " 1.10 |"
expect_in out.txt "A: every kernel, ms a step"
expect_in out.txt "| attention | cudnn::fusion::matmul_dq | 0.150 | 150.0 | 1.0 |"
expect_in out.txt "| attention | cudnn::fusion::matmul_dq | 0.165 | 165.0 | 1.0 |"
expect_in out.txt "| optimizer + grad norm | adamw_kernel | 2.500 |"
grep -v embedding a.tsv >none.tsv
run 1 python3 "$table" --model m.json --mbs 1 N=none.tsv
expect_in err.txt "none.tsv: no training step found"
run 2 python3 "$table" --model m.json --mbs 1 a.tsv
expect_in err.txt "a.tsv: expected LABEL=TRACE.tsv"
echo "PASS [$case_name]"
