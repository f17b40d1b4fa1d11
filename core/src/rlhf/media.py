"""The media layout of a VLM sample: what a processor plugin returns for a prompt's images, and how a batch of
samples becomes model inputs. Public: rollout engines and processors use it (docs/plugin-api.md)."""

from __future__ import annotations

from typing import Any

__all__ = ["collate_media"]


def collate_media(media: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Model inputs of the samples' media: every array concatenated along its first axis, in sample order,
    other axes zero-padded to the largest (Qwen-VL: ``pixel_values`` (patches, features), ``image_grid_thw``
    (images, 3); Idefics3: ``pixel_values`` (1, images, 3, H, W), whose all-zero padding images the model
    skips). ``images`` (the encoded images, for engines that run their own processor) is not a model
    input. Samples without media add nothing. A processor plugin returns media in this layout."""
    import numpy as np
    import torch

    present = [m for m in media if m]
    if not present:
        return {}
    out = {}
    for key in present[0]:
        if key == "images":
            continue
        arrays = [np.asarray(m[key]) for m in present]
        widest = np.max([a.shape for a in arrays], axis=0)
        arrays = [np.pad(a, [(0, 0)] + [(0, int(w) - n) for w, n in zip(widest[1:], a.shape[1:])]) for a in arrays]
        out[key] = torch.from_numpy(np.concatenate(arrays))
    return out
