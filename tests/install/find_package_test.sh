#!/usr/bin/env bash
# usage: find_package_test.sh <build dir> <consumer source dir> <cmake>
set -euo pipefail
build_dir=$1 consumer=$2 cmake=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cmake" --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
test -x "$work/prefix/bin/ddprun" || { echo "ddprun was not installed"; exit 1; }
# Headers that are not the API (the libraries' internal/ folders) stay out of the prefix.
for header in ddp/common/logging.h ddp/common/json.h ddp/store/protocol.h ddp/store/store_util.h; do
  if [[ -e "$work/prefix/include/$header" ]]; then echo "$header was installed"; exit 1; fi
done
test -e "$work/prefix/include/ddp/store/store.h" || { echo "ddp/store/store.h was not installed"; exit 1; }
# The installed headers expose neither spdlog nor nlohmann, but the worker
# library's logger.h, whose one purpose is to hand out its spdlog logger.
if exposed=$(grep -rlE '#include <(spdlog|nlohmann)/' "$work/prefix/include/ddp" |
             grep -v '/ddp/worker/logger\.h$'); then
  echo "installed headers that include spdlog or nlohmann: $exposed"; exit 1
fi
"$cmake" -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$work/build" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
# Two ranks through ddprun from the installed prefix: each all-reduces its rank + 1.
output=$("$work/prefix/bin/ddprun" --standalone --nproc_per_node=2 --no_python "$work/build/consumer")
echo "$output"
grep -q "rank 0 of 2: sum 3" <<< "$output"
grep -q "rank 1 of 2: sum 3" <<< "$output"
