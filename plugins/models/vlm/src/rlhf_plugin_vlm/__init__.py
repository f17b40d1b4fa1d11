"""Vision-language RLHF: ``--data.image_key KEY --data.max_images_per_prompt N``.

Each prompt row names its images under ``KEY`` (a path, a ``file://`` URL, or inline base64 /
``data:image/...;base64,`` text; one or a list). The processor (``rlhf.components.Processor``)
loads them with PIL, places one image part per image before the prompt text in the chat
template, and returns the prompt ids with the image tokens expanded plus the model's image
inputs (Qwen-VL layout: ``pixel_values``, ``image_grid_thw``) as the prompt's ``media``. The model
loader loads the actor and reference as image-text-to-text models with the vision tower frozen
(``--vlm.train_vision_tower`` trains it); only trainable weights are synced to the engines.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_model_loaders(register):
    register("vlm", "rlhf_plugin_vlm.model:VisionLanguageModel", description="VLM actor/reference (image-text-to-text)")


@rlhf.hookimpl
def rlhf_register_processors(register):
    register("vlm", "rlhf_plugin_vlm.processor:ImagePromptProcessor", description="prompt rows with images -> ids + pixels")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_vlm.model:Options", namespace="vlm")
