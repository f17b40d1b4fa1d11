"""``rlhf chat``: the command class, its flags, and the read-generate-stream loop.

:class:`ChatCommand` is registered lazily by this plugin's ``rlhf_register_commands``; it runs
once in the CLI process. Flags are checked before the model loads; a bad one raises
:class:`rlhf.errors.ConfigError` (``rlhf: error: …``, exit status 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, ClassVar, TextIO

from rlhf.errors import ConfigError

EXIT_WORDS = frozenset({"/exit", "/quit", "exit"})  # "exit" and "clear" are OpenRLHF's interactive_chat words
RESET_WORDS = frozenset({"/reset", "/clear", "clear"})
FALLBACK_TEMPLATE = "User: {}\nAssistant: "  # for tokenizers without a chat template (the supervised trainers' default)


class ChatCommand:
    """``rlhf chat``: talk to a model in the terminal."""

    help: ClassVar[str] = (
        "Chat with a model in the terminal: the conversation goes through the tokenizer's chat template (or "
        "--input_template), the reply streams token by token. /reset starts over, /exit or Ctrl-D quits."
    )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", required=True, help="model dir (HF format) or hub name")
        parser.add_argument("--lora_path", default=None, help="a LoRA adapter dir (peft) to put on --model")
        parser.add_argument("--max_new_tokens", type=int, default=1024, help="max tokens per reply")
        parser.add_argument("--max_len", type=int, default=4096,
                            help="max conversation + reply tokens; the oldest turns are dropped to fit")
        parser.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (0: greedy)")
        parser.add_argument("--top_p", type=float, default=0.9, help="nucleus sampling")
        parser.add_argument("--repetition_penalty", type=float, default=1.0, help="HF repetition penalty")
        parser.add_argument("--system_prompt", default=None, help="a system message opening every conversation")
        parser.add_argument("--input_template", default=None,
                            help="render turns with this template (one {}) instead of the tokenizer's chat template; "
                                 f"used when the tokenizer has none (default then: {FALLBACK_TEMPLATE!r})")
        parser.add_argument("--apply_chat_template", action="store_true",
                            help="accepted for OpenRLHF compatibility: the chat template is used whenever the tokenizer has one")
        parser.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"], default="auto",
                            help="weights dtype (auto: bf16 on a GPU, fp32 on CPU)")
        parser.add_argument("--attn_implementation", default="sdpa", help="HF attention implementation")
        parser.add_argument("--seed", type=int, default=0, help="sampling seed")

    def run(self, host: Any, args: argparse.Namespace) -> int:
        check_args(args)
        session = ChatSession.load(args)
        return session.loop(sys.stdin, sys.stdout)


def check_args(args: argparse.Namespace) -> None:
    """Flag errors that need no model, before anything loads."""
    for flag in ("max_new_tokens", "max_len"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.max_new_tokens >= args.max_len:
        raise ConfigError(f"--max_new_tokens {args.max_new_tokens} leaves no room for the conversation in "
                          f"--max_len {args.max_len}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise ConfigError(f"--temperature must be >= 0 and --top_p in (0, 1], got {args.temperature} and {args.top_p}")
    if args.input_template is not None and "{}" not in args.input_template:
        raise ConfigError(f"--input_template {args.input_template!r} has no {{}} where the message goes")
    if args.lora_path is not None and not (Path(args.lora_path) / "adapter_config.json").is_file():
        raise ConfigError(f"--lora_path {args.lora_path}: no adapter_config.json there (a peft LoRA adapter dir)")


class ChatSession:
    """A model, its tokenizer and the generation settings; :meth:`loop` runs the conversation."""

    def __init__(self, model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
        self.model, self.tokenizer, self.args = model, tokenizer, args
        self.use_chat_template = args.input_template is None and bool(getattr(tokenizer, "chat_template", None))
        self.template = args.input_template or FALLBACK_TEMPLATE

    @classmethod
    def load(cls, args: argparse.Namespace) -> ChatSession:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        dtype = dtypes.get(args.dtype) or (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
        try:
            tokenizer = AutoTokenizer.from_pretrained(args.model)
            model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation=args.attn_implementation)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--model {args.model}: cannot load it ({exc})") from None
        if args.lora_path:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, args.lora_path)
        if torch.cuda.is_available():
            model = model.cuda()
        torch.manual_seed(args.seed)
        return cls(model.eval(), tokenizer, args)

    def prompt_ids(self, history: list[dict[str, str]]) -> list[int]:
        """The token ids of the conversation so far, ending where the assistant's reply begins."""
        if self.use_chat_template:
            return list(self.tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False))
        text = "".join(self.template.format(turn["content"]) if turn["role"] != "assistant" else turn["content"] + "\n"
                       for turn in history)
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def fit(self, history: list[dict[str, str]]) -> list[int] | None:
        """Drop the oldest exchanges until the prompt and a full reply fit in --max_len (None: the message alone is too long)."""
        budget = self.args.max_len - self.args.max_new_tokens
        opening = 1 if history and history[0]["role"] == "system" else 0
        while True:
            ids = self.prompt_ids(history)
            if len(ids) <= budget:
                return ids
            if len(history) - opening <= 1:
                return None
            del history[opening:opening + 2]  # the oldest user message and its reply

    def reply(self, ids: list[int], out: TextIO) -> str:
        """Generate a reply to ``ids``, writing each piece to ``out`` as it is decoded; returns the whole reply."""
        from threading import Thread

        import torch
        from transformers import TextIteratorStreamer

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        sampling = self.args.temperature > 0
        settings: dict[str, Any] = dict(
            input_ids=torch.tensor([ids], device=self.model.device), attention_mask=torch.ones(1, len(ids), dtype=torch.long,
                                                                                              device=self.model.device),
            max_new_tokens=self.args.max_new_tokens, do_sample=sampling, repetition_penalty=self.args.repetition_penalty,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id,
            streamer=streamer,
        )
        if sampling:
            settings.update(temperature=self.args.temperature, top_p=self.args.top_p)
        failure: list[BaseException] = []

        def generate() -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(**settings)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(exc)
                streamer.end()

        worker = Thread(target=generate, daemon=True)
        worker.start()
        pieces = []
        for piece in streamer:
            pieces.append(piece)
            out.write(piece)
            out.flush()
        worker.join()
        if failure:
            raise failure[0]
        return "".join(pieces)

    def loop(self, stdin: TextIO, out: TextIO) -> int:
        """Read a message, stream the reply, repeat; /reset clears the conversation, /exit or end of input quits."""
        opening = [{"role": "system", "content": self.args.system_prompt}] if self.args.system_prompt else []
        history = list(opening)
        out.write(f"rlhf chat: {self.args.model}{' + ' + self.args.lora_path if self.args.lora_path else ''}. "
                  "/reset starts over, /exit or Ctrl-D quits.\n")
        while True:
            out.write("User: ")
            out.flush()
            line = stdin.readline()
            if not line:  # end of input (Ctrl-D)
                out.write("\n")
                return 0
            message = line.strip()
            if message in EXIT_WORDS:
                return 0
            if message in RESET_WORDS:
                history = list(opening)
                out.write("(new conversation)\n")
                continue
            if not message:
                continue
            history.append({"role": "user", "content": message})
            ids = self.fit(history)
            if ids is None:
                history.pop()
                out.write(f"(that message is too long for --max_len {self.args.max_len} with --max_new_tokens "
                          f"{self.args.max_new_tokens}; not sent)\n")
                continue
            out.write("Assistant: ")
            out.flush()
            history.append({"role": "assistant", "content": self.reply(ids, out)})
            out.write("\n")
