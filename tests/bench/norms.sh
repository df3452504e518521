#!/usr/bin/env bash
# bench/norms/run.sh without a GPU: a stand-in bench that prints its
# variant's lines, and the table run.sh makes of them (a row per shape
# and way, a column per variant, the copy last, * where a variant's
# output hash differs from the first's), VARIANTS taken as asked.
# Usage: norms.sh
set -u
root=${PARTITA_SOURCE:?PARTITA_SOURCE names the source tree}
source "$root/tests/cli/lib.sh"
scratch_begin norms
mkdir -p build/bench/norms
cat > build/bench/norms/norm_bench <<'STANDIN'
#!/usr/bin/env bash
variant=${PARTITA_LAYERNORM_BACKWARD:-default}
[ "${PARTITA_LAYERNORM_FORWARD:-default}" = "$variant" ] || exit 3
case $variant in
default) us=56.4; hash=aaaa ;;
team1) us=68.5; hash=aaaa ;;
*) us=59.6; hash=bbbb ;;
esac
echo "# norm_bench on a stand-in; kernels $variant; $2 calls a round"
echo "  rms bwd    8192    2048 $us 4759 34.5 7781 1.63  $hash 1.0e+00"
echo "  rms fwd    8192    2048 40.0 4759 34.5 7781 1.16  dddd -"
echo "   ln bwd    4096    5120 96.4 1740 42.3 3966 2.28  cccc 2.0e+00"
STANDIN
chmod +x build/bench/norms/norm_bench
VARIANTS="default team1 team4" CALLS=7 run 0 bash "$root/bench/norms/run.sh" build
expect_in out.txt "kernels team4; 7 calls a round"
expect_in out.txt "shape (us)             default     team1     team4      copy"
expect_in out.txt "rms bwd 8192x2048         56.4      68.5     59.6\\*      34.5"
expect_in out.txt "rms fwd 8192x2048         40.0      40.0      40.0      34.5"
expect_in out.txt "ln bwd 4096x5120          96.4      96.4      96.4      42.3"
echo "PASS [$case_name]"
