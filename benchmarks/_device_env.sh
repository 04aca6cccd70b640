# Sourced by the device scripts: unpacks the carried environment archive (.device_env/gpu-env.tar.xz, built on a
# machine with a package index by `python -m benchmarks.device_env build`: the pinned wheels, vLLM 0.32.0's Python
# sources, the stand-ins for its compiled modules) into a site directory named by the archive's hash, once per
# archive (under R9K_SITE_ROOT, default /tmp/r9k-device-env), and puts it before this checkout on PYTHONPATH. The
# host's own torch and Triton are used as they are. R9K_DEVICE_ENV names another archive.
R9K_DEVICE_ENV=${R9K_DEVICE_ENV:-$PWD/.device_env/gpu-env.tar.xz}
if [ ! -f "$R9K_DEVICE_ENV" ]; then
  echo "no environment archive at $R9K_DEVICE_ENV: run 'python -m benchmarks.device_env build' where a package" \
       "index answers, and carry .device_env" >&2
  return 1
fi
R9K_SITE=${R9K_SITE_ROOT:-/tmp/r9k-device-env}/$(sha256sum "$R9K_DEVICE_ENV" | cut -c1-16)
if [ ! -f "$R9K_SITE/r9k-device-env.json" ]; then
  rm -rf "$R9K_SITE.partial" && mkdir -p "$R9K_SITE.partial" || return 1
  python3 - "$R9K_DEVICE_ENV" "$R9K_SITE.partial" <<'PY' || { echo "cannot unpack $R9K_DEVICE_ENV" >&2; return 1; }
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], filter="data")
PY
  rm -rf "$R9K_SITE" && mv "$R9K_SITE.partial" "$R9K_SITE" || return 1
fi
export R9K_SITE
# the checkout's stand-ins are the ones that run: an archive built before a stand-in changed carries the older one
for f in $(cd benchmarks/device_env/stand_ins && find . -type f ! -path '*__pycache__*'); do
  if ! cmp -s "benchmarks/device_env/stand_ins/$f" "$R9K_SITE/$f"; then
    mkdir -p "$(dirname "$R9K_SITE/$f")" && cp "benchmarks/device_env/stand_ins/$f" "$R9K_SITE/$f" || return 1
    echo "stand-in from the checkout: ${f#./} (the archive's differs)" >&2
  fi
done
# r9k's plugin entry point (vllm.general_plugins -> r9k:register), as `pip install -e .` would declare it, so that
# vLLM loads this checkout's r9k in every process it starts; written beside the site, outside the checkout
R9K_PLUGIN_SITE=$R9K_SITE.plugin
R9K_VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' r9k/version.py)
if [ ! -f "$R9K_PLUGIN_SITE/r9k-$R9K_VERSION.dist-info/entry_points.txt" ]; then
  rm -rf "$R9K_PLUGIN_SITE" && mkdir -p "$R9K_PLUGIN_SITE/r9k-$R9K_VERSION.dist-info" || return 1
  printf 'Metadata-Version: 2.1\nName: r9k\nVersion: %s\n' "$R9K_VERSION" \
    > "$R9K_PLUGIN_SITE/r9k-$R9K_VERSION.dist-info/METADATA"
  printf '[vllm.general_plugins]\nr9k = r9k:register\n' > "$R9K_PLUGIN_SITE/r9k-$R9K_VERSION.dist-info/entry_points.txt"
fi
export PYTHONPATH=$R9K_SITE:$PWD:$R9K_PLUGIN_SITE
export PYTHONUNBUFFERED=1
# what a serve reads from the archive (benchmarks/device_env/build.py add_serve_files), unless set already
export R9K_TOKENIZER_DIR=${R9K_TOKENIZER_DIR:-$R9K_SITE/r9k-tokenizers}
if [ -d "$R9K_SITE/r9k-data/gsm8k" ]; then export R9K_DATA_DIR=${R9K_DATA_DIR:-$R9K_SITE/r9k-data}; fi
