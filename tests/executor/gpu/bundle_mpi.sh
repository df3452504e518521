#!/usr/bin/env bash
# Copies this machine's Open MPI runtime (Debian's openmpi-bin and
# libopenmpi3: mpirun / orterun, orted, the Open MPI, PMIx, hwloc and
# libevent libraries, the MCA plugin directories, help files and
# configuration) into DIR, so that a machine without Open MPI (the GPU
# machine) can run `mpirun` on one host from there. Writes DIR/env.sh,
# which, sourced, sets the environment that relocates the copy to
# wherever DIR then is, and prints it.
#
# Usage: tests/executor/gpu/bundle_mpi.sh DIR
#   DIR  created or emptied; name it build-something inside the
#        repository to carry it to the GPU machine (git ignores build*)
# Only one host: the bundle launches with the "isolated" launcher (no
# ssh) over shared memory, which is what a 2-GPU machine without a
# network needs. glibc itself is not copied (the machine has its own).
set -eu
dir=${1:?usage: bundle_mpi.sh DIR}
command -v ompi_info >/dev/null || {
    echo "bundle_mpi.sh: no ompi_info here: install openmpi-bin and libopenmpi-dev" >&2
    exit 1
}
path_of() { ompi_info --parsable --path "$1" | sed 's/^[^:]*:[^:]*://'; }
ompi_pkglibdir=$(path_of pkglibdir)     # the MCA components
ompi_pkgdatadir=$(path_of pkgdatadir)   # help-*.txt
ompi_sysconfdir=$(path_of sysconfdir)   # openmpi-mca-params.conf
bindir=$(path_of bindir)
# PMIx and hwloc are Debian's own packages, each with plugins
pmix_prefix=$(dirname "$(dirname "$(readlink -f "$(ldconfig -p |
    awk '/libpmix\.so\.2 /{print $NF; exit}')")")")
pmix_lib=$(ompi_info --all --parsable 2>/dev/null |
    grep -o '/[^:]*pmix2/lib' | head -1)
[ -n "$pmix_lib" ] && pmix_prefix=$(dirname "$pmix_lib")
hwloc_plugins=$(dirname "$(readlink -f "$(ldconfig -p |
    awk '/libhwloc\.so\.15 /{print $NF; exit}')")")/hwloc

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib" "$dir/share" "$dir/etc"
dir=$(cd "$dir" && pwd)

cp -L "$bindir/orterun" "$dir/bin/orterun"
cp -L "$bindir/orterun" "$dir/bin/mpirun"
cp -L "$bindir/orted" "$dir/bin/orted"
cp -rL "$ompi_pkglibdir" "$dir/lib/openmpi"
cp -rL "$ompi_pkgdatadir" "$dir/share/openmpi"
cp -rL "$ompi_sysconfdir" "$dir/etc/openmpi"
if [ -d "$pmix_prefix/lib" ]; then
    mkdir -p "$dir/pmix"
    cp -rL "$pmix_prefix/lib" "$dir/pmix/lib"
    [ -d "$pmix_prefix/share" ] && cp -rL "$pmix_prefix/share" "$dir/pmix/share"
    rm -f "$dir/pmix/lib/"*.a
fi
# hwloc runs without its plugins (they pull in X11, OpenCL, libxml2 and
# ICU, 40 MB): an empty plugin directory keeps it from the system's.
mkdir -p "$dir/lib/hwloc"
# The transports and the OpenSHMEM layer a single host over shared memory
# never loads (UCX, libfabric, verbs, PSM, usNIC): leaving them and the
# libraries only they need out keeps the bundle small enough to carry.
find "$dir/lib/openmpi" "$dir/pmix" -name '*.so' \( -name '*ucx*' \
    -o -name '*ofi*' -o -name '*openib*' -o -name '*psm*' \
    -o -name '*usnic*' -o -name '*verbs*' -o -name 'mca_spml_*' \
    -o -name 'mca_sshmem_*' -o -name 'mca_memheap_*' -o -name 'mca_scoll_*' \
    -o -name 'mca_atomic_*' -o -name '*portals*' -o -name '*java*' \) \
    -delete
find "$dir/lib/openmpi" "$dir/pmix" -name '*.la' -delete

# Every shared library these need, but glibc's own.
is_glibc() {
    case "$(basename "$1")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|\
    libresolv.so*|libutil.so*|libnsl.so*|libanl.so*) return 0 ;;
    liboshmem.so*) return 0 ;; # OpenSHMEM: not used
    esac
    return 1
}
copy_needs() { # FILE...: the libraries ldd finds for them, into DIR/lib
    local file lib
    for file in "$@"; do
        ldd "$file" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
        while read -r lib; do
            is_glibc "$lib" && continue
            [ -e "$dir/lib/$(basename "$lib")" ] ||
                cp -L "$lib" "$dir/lib/$(basename "$lib")"
        done
    done
}
mapfile -t objects < <(find "$dir/bin" "$dir/lib" "$dir/pmix" -type f \
    \( -name '*.so*' -o -perm -u+x \) 2>/dev/null)
copy_needs "${objects[@]}"
# ...and what the copied libraries need in turn (one more round covers
# Open MPI's chain: libmpi -> libopen-rte -> libopen-pal -> libevent ...)
copy_needs "$dir"/lib/*.so*
copy_needs "$dir"/lib/*.so*

cat >"$dir/env.sh" <<'ENV'
# Sourced: relocates the Open MPI bundle of this directory.
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX="$bundle" OPAL_EXEC_PREFIX="$bundle"
export OPAL_BINDIR="$bundle/bin" OPAL_LIBDIR="$bundle/lib"
export OPAL_PKGLIBDIR="$bundle/lib/openmpi"
export OPAL_DATAROOTDIR="$bundle/share" OPAL_DATADIR="$bundle/share"
export OPAL_PKGDATADIR="$bundle/share/openmpi"
export OPAL_SYSCONFDIR="$bundle/etc/openmpi"
export PMIX_INSTALL_PREFIX="$bundle/pmix"
export PMIX_MCA_mca_base_component_path="$bundle/pmix/lib/pmix"
export HWLOC_PLUGINS_PATH="$bundle/lib/hwloc"
export PATH="$bundle/bin${PATH:+:$PATH}"
export LD_LIBRARY_PATH="$bundle/lib:$bundle/pmix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# one host, no network, maybe no ssh, maybe in a container
export OMPI_MCA_plm=isolated
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV
echo "# Open MPI bundled in $dir ($(du -sh "$dir" | cut -f1)); to use it:"
echo "source $dir/env.sh   # sets:"
sed -n 's/^export /  /p' "$dir/env.sh"
