#!/bin/sh
# Records what the real driver does (driver-facts.cu) into DIR/driver-facts.txt, and what a bracket of timing
# events holds (bracket-facts.cu) into DIR/bracket-facts.txt, on a GPU node with nvcc.
# The link goes against the toolkit's stub libcuda where it has one, else the driver's own library.
set -eu
out=${1:?usage: record.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
nvcc_dir=$(dirname "$(command -v nvcc)")
lib=""
for d in "$nvcc_dir/../lib64/stubs" "$nvcc_dir/../targets/x86_64-linux/lib/stubs"; do
  [ -e "$d/libcuda.so" ] && lib="-L$d -lcuda" && break
done
[ -n "$lib" ] || lib=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
nvcc -O2 -o "$out/driver-facts" "$here/driver-facts.cu" $lib -lpthread
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/driver-facts.txt"
"$out/driver-facts" >> "$out/driver-facts.txt" 2>&1
nvcc -O2 -o "$out/bracket-facts" "$here/bracket-facts.cu" $lib
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/bracket-facts.txt"
"$out/bracket-facts" >> "$out/bracket-facts.txt" 2>&1
