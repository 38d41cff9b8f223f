#!/usr/bin/env bash
# usage: pkg_config_test.sh <build dir> <consumer source dir> <cmake>
# The installed pkg-config files work for a build system that is not CMake:
# install into a temporary prefix, compile and link the consumer with nothing but
# `pkg-config --cflags --libs ddp`, and run it under the installed ddprun. With
# the libtorch adapter, ddp-torch.pc must name include folders that exist and
# libraries that all link.
set -euo pipefail
build_dir=$1 consumer=$2 cmake=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v pkg-config >/dev/null || { echo "pkg-config is not installed (scripts/setup installs it)"; exit 1; }
"$cmake" --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
pc_dir=$(dirname "$(find "$work/prefix" -name ddp.pc -print -quit)")
[[ -f $pc_dir/ddp.pc ]] || { echo "ddp.pc was not installed under $work/prefix"; exit 1; }
export PKG_CONFIG_PATH=$pc_dir
pkg-config --validate ddp
read -r -a flags <<< "$(pkg-config --cflags --libs ddp)"
echo "pkg-config --cflags --libs ddp: ${flags[*]}"
c++ -std=c++20 -o "$work/consumer" "$consumer/main.cc" "${flags[@]}"
output=$("$work/prefix/bin/ddprun" --standalone --nproc_per_node=2 --no_python "$work/consumer")
echo "$output"
grep -q "rank 0 of 2: sum 3" <<< "$output"
grep -q "rank 1 of 2: sum 3" <<< "$output"

if [[ -f $pc_dir/ddp-torch.pc ]]; then
  pkg-config --validate ddp-torch
  for flag in $(pkg-config --cflags-only-I ddp-torch); do
    [[ -d ${flag#-I} ]] || { echo "ddp-torch.pc names a missing include folder: ${flag#-I}"; exit 1; }
  done
  # Compiling against libtorch's headers takes minutes on two cores: link only,
  # keeping every library (--no-as-needed), so each one must be found.
  echo 'int main() { return 0; }' > "$work/empty.cc"
  read -r -a torch_libs <<< "$(pkg-config --libs ddp-torch)"
  c++ -o "$work/torch_consumer" "$work/empty.cc" -Wl,--no-as-needed "${torch_libs[@]}"
  ldd "$work/torch_consumer" > "$work/ldd.txt"
  grep -q 'libtorch_cpu\.so.* => /' "$work/ldd.txt" || { cat "$work/ldd.txt"; echo "libtorch_cpu was not linked"; exit 1; }
  echo "ddp-torch.pc: $(pkg-config --libs ddp-torch)"
fi
