#!/usr/bin/env bash
# Runs mpi_comm_check as 3 processes; exit 77 (skipped) without mpirun.
# usage: mpi_comm_check.sh PROGRAM
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
exec timeout 60 mpirun --oversubscribe -np 3 "$1"
