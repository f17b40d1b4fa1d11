"""Loading HF models for the actor/reference (causal LM) and critic/reward (value head) roles."""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from rlhf.environment import torchvision_clash
from rlhf.errors import ConfigError

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig

__all__ = ["torch_dtype", "dtype_of", "seed_process", "attn_implementation", "check_model_source",
           "checkpoint_sampling_defaults", "load_tokenizer", "load_causal_lm", "load_generative", "load_value_model",
           "token_id", "token_values", "VISION_MODULES", "vision_encoder", "check_synced_names"]

log = logging.getLogger("rlhf.models")


def torch_dtype(name: str) -> Any:
    """``--ds.param_dtype`` value (``bf16``, ``fp16``, ``fp32``) -> torch dtype."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def dtype_of(config: RunConfig) -> Any:
    """The dtype a run's models load in (``--ds.param_dtype``)."""
    return torch_dtype(config.ds.param_dtype)


def seed_process(seed: int, full_determinism: bool) -> None:
    """Seed python, numpy and torch in this process (OpenRLHF's ``set_seed`` on every rank), so
    random initialisations (a critic's new value head) repeat from run to run.

    ``--train.full_determinism_enable`` also switches torch to deterministic algorithms, with
    the CUDA settings they need (``transformers.enable_full_determinism``: cuDNN deterministic
    and without benchmarking, a fixed cuBLAS workspace, deterministic flash-attention backward,
    and ``CUDA_LAUNCH_BLOCKING=1``, which serialises kernel launches: expect GPU steps to be
    markedly slower). An op without a deterministic implementation then raises instead of
    running.
    """
    import transformers

    if full_determinism:
        transformers.enable_full_determinism(seed)
    else:
        transformers.set_seed(seed)


def attn_implementation(requested: str) -> str:
    """flash-attn is GPU-only; fall back to sdpa (same numbers, slower) when it cannot run here."""
    import torch

    if requested.startswith("flash_attention") and (not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None):
        log.info("attention %s is unavailable on this machine; using sdpa", requested)
        return "sdpa"
    return requested


def _load_attention(requested: str) -> str | None:
    """What a load asks transformers for: the requested attention, except where :func:`attn_implementation` fell back
    from flash-attn: then transformers' own default, sdpa where the architecture has it and eager where it does not
    (gpt-oss's attention sinks), instead of a refusal of sdpa."""
    resolved = attn_implementation(requested)
    return None if resolved != requested and resolved == "sdpa" else resolved


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")


def check_model_source(path: str, flag: str) -> Any:
    """In the CLI process, before any worker starts: ``path`` is a model directory (a config and
    weights) or a hub name whose config loads; else a :class:`ConfigError` naming ``flag``.

    Returns the model's config: for a local directory its ``config.json`` read as plain JSON
    (attributes, as a namespace), so the check never waits for the torch import behind
    ``AutoConfig``; for a hub name the ``AutoConfig``.
    """
    import json
    from pathlib import Path
    from types import SimpleNamespace

    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir() or not (local / "config.json").is_file():
            raise ConfigError(f"{flag} {path}: not a model directory (no config.json); give a directory written by "
                              "save_pretrained or a hub name")
        if not any(any(local.glob(pattern)) for pattern in WEIGHT_FILES):
            raise ConfigError(f"{flag} {path}: the directory has a config.json but no weights "
                              "(*.safetensors, pytorch_model*.bin)")
        try:
            fields = json.loads((local / "config.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{flag} {path}: config.json is not readable JSON ({exc}); "
                              "write it again with save_pretrained") from None
        if not isinstance(fields, dict):
            raise ConfigError(f"{flag} {path}: config.json holds a {type(fields).__name__}, not an object of settings")
        return SimpleNamespace(**fields)
    if path.startswith((".", "/", "~")) or path.count("/") > 1:
        raise ConfigError(f"{flag} {path}: no such model directory")
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - offline hub, unknown name, broken config.json: one message
        _raise_environment_cause(exc)
        raise ConfigError(f"{flag} {path}: cannot load the model config ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:200]})") from exc


#: ``generation_config.json`` keys that leave the sampled distribution alone: token ids (the engines stop at the
#: checkpoint's eos ids), length budgets (``--rollout.max_new_tokens`` sets the run's) and bookkeeping
_NEUTRAL_GENERATION_KEYS = frozenset({
    "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "transformers_version",
    "_from_model_config", "max_length", "max_new_tokens", "use_cache", "do_sample", "cache_implementation",
    "return_dict_in_generate", "output_scores", "output_logits", "output_attentions", "output_hidden_states",
    "num_beams", "num_return_sequences", "length_penalty", "early_stopping",
})
#: values of the sampling keys that change nothing (a checkpoint may write them out)
_NEUTRAL_VALUES = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
                   "eta_cutoff": 0.0, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
                   "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0}


def checkpoint_sampling_defaults(path: str) -> dict[str, Any]:
    """The sampling defaults a local model directory's ``generation_config.json`` ships (``repetition_penalty``,
    ``top_k``, ``no_repeat_ngram_size``, ``temperature``…), every key that would change the distribution ``generate``
    samples; ``{}`` where there is no such file or it is not a JSON object. Every rollout engine samples the policy
    at ``--rollout.temperature`` and ``--rollout.top_p`` and ignores these (docs/plugins/rollout-engine.md): the
    caller names them once."""
    import json
    from pathlib import Path

    file = Path(path).expanduser() / "generation_config.json"
    try:
        fields = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(fields, dict):
        return {}
    return {key: value for key, value in fields.items() if key not in _NEUTRAL_GENERATION_KEYS
            and value not in (None, [], {}) and _NEUTRAL_VALUES.get(key, object()) != value}


def load_tokenizer(path: str, flag: str, **kwargs: Any) -> Any:
    """The tokenizer of a model checked by :func:`check_model_source`; a model without one names ``flag``.
    ``kwargs``: more ``from_pretrained`` arguments (``use_fast``). A local directory's tokenizer encodes as its
    ``tokenizer.json`` says (:func:`_as_its_file_says`)."""
    try:
        from transformers import AutoTokenizer

        return _as_its_file_says(AutoTokenizer.from_pretrained(path, **kwargs), path, kwargs)
    except Exception as exc:  # noqa: BLE001 - missing/broken tokenizer files surface as many exception types
        _raise_environment_cause(exc)
        raise ConfigError(f"{flag} {path}: cannot load its tokenizer ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:200]})") from exc


#: text whose pieces every byte-level or sentencepiece tokenizer keeps: accents, CJK, an emoji, digits, whitespace
_TOKENIZER_PROBE = "Grüße, 世界! 答案是 15 😀\n\t x"


def _as_its_file_says(tokenizer: Any, path: str, kwargs: dict[str, Any]) -> Any:
    """``tokenizer``, or the directory's ``tokenizer.json`` loaded as it is where the two encode differently.

    transformers 5 builds a tokenizer from the class its ``tokenizer_config.json`` names, and that class may bring
    its own pre-tokenizer: DeepSeek-V3's byte-level BPE, named ``LlamaTokenizerFast``, got Llama's Metaspace one and
    encoded "答案是 15" as the id of "15" alone, silently. The file's own tokenizer is what the model was trained with."""
    from pathlib import Path

    file = Path(path).expanduser() / "tokenizer.json"
    if not file.is_file() or not getattr(tokenizer, "is_fast", False) or kwargs.get("use_fast") is False:
        return tokenizer
    from tokenizers import Tokenizer

    expected = Tokenizer.from_file(str(file)).encode(_TOKENIZER_PROBE, add_special_tokens=False).ids
    if tokenizer(_TOKENIZER_PROBE, add_special_tokens=False)["input_ids"] == expected:
        return tokenizer
    from transformers import PreTrainedTokenizerFast

    faithful = PreTrainedTokenizerFast.from_pretrained(path, **kwargs)
    log.warning("%s: transformers' %s encodes text otherwise than the directory's tokenizer.json; using the "
                "tokenizer.json as it is", path, type(tokenizer).__name__)
    return faithful


def _raise_environment_cause(exc: Exception) -> None:
    """A broken environment makes transformers fail with messages about the model; name the real cause instead."""
    if (clash := torchvision_clash()) is not None:
        raise ConfigError(str(clash)) from exc


def _experts(experts: str | None) -> dict[str, Any]:
    """``--ds.experts_implementation``: how MoE layers compute their experts (None: transformers' choice)."""
    return {"experts_implementation": experts} if experts else {}


def load_causal_lm(path: str, dtype: Any, attn: str, *, experts: str | None = None, **kwargs: Any) -> Any:
    """``experts``: ``--ds.experts_implementation``; ``kwargs``: more ``from_pretrained`` arguments (a 4-bit
    quantization config)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=_load_attention(attn),
                                                **_experts(experts), **kwargs)


def token_id(model: Any, name: str) -> Any:
    """``config.<name>`` (``pad_token_id``, ``eos_token_id``) of a model, read from its text config when
    the top-level config has none (vision-language models keep them there)."""
    config = model.config
    value = getattr(config, name, None)
    if value is None and hasattr(config, "get_text_config"):
        value = getattr(config.get_text_config(), name, None)
    return value


def load_generative(path: str, dtype: Any, **kwargs: Any) -> Any:
    """The text generator in ``path`` for a rollout engine: a causal LM, or an image-text-to-text model
    (a VLM, whose ``generate`` also takes the prompts' ``pixel_values``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = AutoConfig.from_pretrained(path).model_type
    auto = AutoModelForCausalLM if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModelForImageTextToText
    return auto.from_pretrained(path, dtype=dtype, **kwargs)


def load_value_model(path: str, dtype: Any, attn: str, head: str = "score", *, require_head: bool = False,
                     experts: str | None = None, gathered: Any = None, **kwargs: Any) -> Any:
    """A sequence-regression model whose ``head`` maps every hidden state to one value.

    A causal-LM checkpoint (e.g. the actor used as critic, or an SFT model becoming a
    reward model) gets a fresh bias-free head drawn from N(0, 1/(d+1)), as OpenRLHF's.
    ``require_head``: a checkpoint without a trained head is an error (reward models must have one).
    ``experts``: ``--ds.experts_implementation``; ``gathered``: the training backend's
    :meth:`~rlhf.components.TrainingBackend.gathered` when the weights may be sharded at load;
    ``kwargs``: more ``from_pretrained`` arguments (a 4-bit quantization config).
    """
    from transformers import AutoModelForSequenceClassification

    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=dtype, attn_implementation=_load_attention(attn), output_loading_info=True,
        **_experts(experts), **kwargs
    )
    if not hasattr(model, head):
        raise ValueError(f"model at {path} has no value head named {head!r} (--ds.value_head_prefix); "
                         f"{type(model).__name__} names its head 'score'")
    if any(key.startswith(f"{head}.") for key in info.get("missing_keys", ())):
        if require_head:
            raise ValueError(f"{path} has no trained value head {head!r}, so its rewards would be random; "
                             "pass a reward model trained with `rlhf train rm` (or set --ds.value_head_prefix)")
        _init_value_head(getattr(model, head), model.config.hidden_size, gathered)
    return model


def _init_value_head(head: Any, hidden_size: int, gathered: Any) -> None:
    import contextlib

    import torch

    with gathered(head) if gathered is not None else contextlib.nullcontext(), torch.no_grad():
        head.weight.normal_(mean=0.0, std=1.0 / (hidden_size + 1) ** 0.5)


def token_values(model: Any, input_ids: Any, attention_mask: Any = None, head: str = "score", **inputs: Any) -> Any:
    """Per-position values ``(B, L)`` from a value model: its head applied to every hidden state.

    ``inputs``: more forward arguments (``position_ids`` of a packed batch). A peft-wrapped
    model is read through its base model; the LoRA layers sit inside it.
    """
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    backbone = getattr(model, model.base_model_prefix)
    inputs["use_cache"] = False  # a cache would also switch off packed-sequence masking
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, **inputs).last_hidden_state
    return getattr(model, head)(hidden).squeeze(-1).float()


#: Where image-text-to-text models keep their vision encoder (Qwen-VL: ``model.visual``, Idefics3:
#: ``model.vision_model``, LLaVA/Gemma-3: ``model.vision_tower``).
VISION_MODULES = ("visual", "vision_tower", "vision_model")


def vision_encoder(model: Any) -> tuple[str, Any] | None:
    """A VLM's vision encoder as (its state-dict prefix with the trailing dot, the module); None for a text model."""
    for prefix, owner in (("", model), ("model.", getattr(model, "model", None))):
        for name in VISION_MODULES:
            if owner is not None and hasattr(owner, name):
                return f"{prefix}{name}.", getattr(owner, name)
    return None


def check_synced_names(model: Any, names: set[str]) -> None:
    """A weight sync's tensor names against the engine model's own state dict; a mismatch raises ValueError
    naming the keys. The one exception: a VLM's vision encoder may be missing (the trainer holds it frozen by
    default and sends only trainable weights; the engine keeps the checkpoint's)."""
    own = set(model.state_dict())
    encoder = vision_encoder(model)
    missing = {name for name in own - names if not (encoder and name.startswith(encoder[0]))}
    unexpected = names - own
    if missing or unexpected:
        def listed(keys: set[str]) -> str:
            return ", ".join(sorted(keys)[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "") or "none"
        raise ValueError(f"weight sync into {type(model).__name__}: {len(unexpected)} unexpected tensor(s) ({listed(unexpected)}), "
                         f"{len(missing)} missing ({listed(missing)}); the trainer's model and the engine's must have the same names")
