"""Images of a prompt row: paths, ``file://`` URLs or inline base64, opened with PIL."""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from rlhf.errors import DataError


def row_images(row: dict[str, Any], key: str, limit: int) -> list[Any]:
    """The row's images under ``key`` as RGB PIL images; a missing file, unreadable bytes or more than
    ``limit`` images is a :class:`DataError` naming the image (the caller adds the file and row)."""
    value = row.get(key)
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if len(items) > limit:
        raise DataError(f"has {len(items)} images under {key!r}, more than --data.max_images_per_prompt {limit}; "
                        "raise the flag or drop images")
    return [open_image(item, key) for item in items]


def open_image(item: Any, key: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    if not isinstance(item, str) or not item:
        raise DataError(f"image {item!r} under {key!r} is not a path, file:// URL or base64 text")
    data = _image_bytes(item, key)
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"image {_short(item)} under {key!r} cannot be read as an image ({exc})") from None


def _image_bytes(item: str, key: str) -> bytes:
    if item.startswith(("http://", "https://")):
        raise DataError(f"image {_short(item)} under {key!r} is a web URL; download it and give the local path")
    if item.startswith("data:"):
        return _decode(item.partition(",")[2], item, key)
    path = Path(item.removeprefix("file://")).expanduser()
    if path.is_file():
        return path.read_bytes()
    if item.startswith(("file://", "/", ".", "~")) or path.suffix.lower() in {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp"}:
        raise DataError(f"image file {item} under {key!r} does not exist")
    return _decode(item, item, key)


def _decode(text: str, item: str, key: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise DataError(f"image {_short(item)} under {key!r} is neither an existing file nor base64 image data") from None


def _short(item: str) -> str:
    """At most 60 characters: a data URI keeps its head (the media type), a path or URL its tail (the file name)."""
    if len(item) <= 60:
        return repr(item)
    return repr(item[:57] + "..." if item.startswith("data:") else "..." + item[-57:])
