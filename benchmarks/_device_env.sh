# Sourced by the device scripts: installs the carried wheels (.whl) into /tmp/site and puts them and vLLM's Python
# sources (.vllm_src: the .py files of the CUDA vllm 0.32.0 wheel, no compiled extension) on PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; return 1; }
export PYTHONPATH=/tmp/site:$PWD/.vllm_src:$PWD
export PYTHONUNBUFFERED=1
