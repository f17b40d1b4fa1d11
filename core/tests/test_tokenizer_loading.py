"""load_tokenizer encodes as the directory's tokenizer.json says, whatever class its tokenizer_config.json names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlhf.models.loading import load_tokenizer


def test_a_byte_level_tokenizer_named_as_llamas_keeps_its_own_pre_tokenizer(tiny_tokenizer_path: Path, tmp_path: Path,
                                                                             caplog) -> None:
    """DeepSeek-V3 ships a byte-level BPE whose tokenizer_config.json names LlamaTokenizerFast; transformers 5 then
    builds Llama's Metaspace pre-tokenizer around its vocabulary and encodes other text than the file does (CJK as
    nothing at all). The same naming on the suite's own byte-level tokenizer: what load_tokenizer returns encodes as
    the file, and says once that it did."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    renamed = tmp_path / "renamed"
    shutil.copytree(tiny_tokenizer_path, renamed)
    config = json.loads((renamed / "tokenizer_config.json").read_text())
    (renamed / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizerFast"}))
    text = "what is 12+30? 答案 ü"
    expected = Tokenizer.from_file(str(renamed / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert AutoTokenizer.from_pretrained(renamed)(text, add_special_tokens=False)["input_ids"] != expected  # the trap
    loaded = load_tokenizer(str(renamed), "--actor.model_name_or_path")
    assert loaded(text, add_special_tokens=False)["input_ids"] == expected
    assert loaded.decode(expected) == text and loaded.eos_token == config["eos_token"]
    assert "encodes text otherwise than the directory's tokenizer.json" in caplog.text
    caplog.clear()
    assert load_tokenizer(str(tiny_tokenizer_path), "--actor.model_name_or_path")(text)["input_ids"][-1] == expected[-1]
    assert "otherwise" not in caplog.text  # a tokenizer that encodes as its file is returned as transformers built it
