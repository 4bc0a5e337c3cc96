# Sourced by bench/lease/run.sh and study.sh (docs/gpu_lease.md): the packages the GPU image lacks (Ray & co., for Python 3.12), the
# shared records beside the repo, `python` on PATH, coreecg.jobs importable from the checkout.
S0=$SECONDS
if [ ! -d /tmp/site312/ray ]; then tar -C /tmp -xJf .gpu/site312.tar.xz; fi
if [ ! -d /tmp/site312/ray/dashboard/client/build ]; then tar -C /tmp/site312 -xJf .gpu/dash.tar.xz; fi
if [ ! -d ../shared/ecg-data/ptbxl ]; then mkdir -p ../shared/ecg-data && tar -C ../shared/ecg-data -xJf .gpu/data.tar.xz; fi
VENV=/opt/torch/.venv/bin       # the image's Python with torch (a plain python3 may be another)
[ -x $VENV/python ] || VENV=$(dirname "$(command -v python3)")
ln -sfn ../jobs coreecg/jobs
export PATH=$VENV:$PATH PYTHONPATH=/tmp/site312:$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python -c "import sys, torch, ray, wfdb, optuna, tensorboardX, pyarrow, pandas, numpy, scipy, sklearn; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name(), 'ray', ray.__version__, 'pyarrow', pyarrow.__version__, 'pandas', pandas.__version__, 'numpy', numpy.__version__)"
echo "setup: $((SECONDS - S0)) s; $(nproc) CPUs; $(free -g | awk '/Mem/{print $2}') GiB"
