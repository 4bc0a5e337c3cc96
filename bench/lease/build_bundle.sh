#!/usr/bin/env bash
# Build what a lent GPU machine lacks, into .gpu/ (git-ignored via .git/info/exclude), for
# bench/lease/run.sh (docs/gpu_lease.md). That machine has Python 3.12 with torch, numpy, pandas,
# pyarrow, scipy and no network; this carries Ray and the rest of `coreecg[ray]` as one xz archive
# (Ray's Java jar, RLlib and the source maps left out: the carried tree is capped at 64 MiB), the
# dashboard's frontend apart, and the shared PTB-XL and CPSC2018 records the study reads.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${COREECG_SHARED_DATA:-../shared/ecg-data}
W=$(mktemp -d)
grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
mkdir -p .gpu
plat=(); for t in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_5; do
    plat+=(--platform "${t}_x86_64"); done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d "$W/whl" \
    "ray[train,tune,data,default]==2.60.0" optuna tensorboardX wfdb
# What the image already has (its package list: the device tool's KINDS.md) is not carried.
have="aiohttp aiosignal attrs certifi charset-normalizer click cloudpickle filelock frozenlist fsspec grpcio h5py
huggingface-hub idna jinja2 markupsafe matplotlib msgpack multidict numpy packaging pandas pillow prometheus-client
propcache protobuf psutil pyarrow pyparsing python-dateutil pyyaml requests safetensors scikit-learn scipy six
typing-extensions urllib3 yarl contourpy cycler fonttools kiwisolver joblib threadpoolctl tqdm aiohappyeyeballs"
keep=()
for f in "$W"/whl/*.whl; do
    name=$(basename "$f" | sed 's/-[0-9].*//' | tr 'A-Z_' 'a-z-')
    grep -qw -- "$name" <<<"$have" || keep+=("$f")
done
python3 -m pip install -q --no-deps --no-compile --target "$W/site312" --python-version 3.12 --implementation cp \
    --only-binary=:all: "${plat[@]}" "${keep[@]}"
rm -rf "$W"/site312/ray/jars "$W"/site312/ray/rllib "$W"/site312/ray/llm "$W"/site312/bin/py-spy
find "$W/site312" -name '*.js.map' -delete
mv "$W/site312/ray/dashboard/client/build" "$W/dash-build"
mkdir -p "$W/dash/ray/dashboard/client" && mv "$W/dash-build" "$W/dash/ray/dashboard/client/build"
tar -C "$W" -cf - site312 | xz -T0 -9 > .gpu/site312.tar.xz
tar -C "$W/dash" -cJf .gpu/dash.tar.xz ray
(cd "$SHARED" && tar -cf - ptbxl/records500 ptbxl/ptbxl_database.csv ptbxl/scp_statements.csv cpsc2018-cinc2020 \
    | xz -T0 -6) > .gpu/data.tar.xz
rm -rf "$W"
du -sh .gpu/*
