"""``rlhf chat`` through a real pseudo-terminal on the tiny offline model: type a line, read the streamed reply."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlhf_plugin_chat.command import ChatCommand

from rlhf.testing.cli import assert_user_error, run_in_process, run_rlhf
from rlhf.testing.conformance import CommandKit

MAX_NEW_TOKENS = 12
#: the random tiny model repeats one special token when greedy; a repetition penalty makes its replies text
PENALTY = "3.0"


class TestChatCommand(CommandKit):
    component, plugin_module, registered_name = ChatCommand, "rlhf_plugin_chat", "chat"

    def argv(self):
        return None  # a run reads the terminal: covered through a pseudo-terminal below


class Terminal:
    """``rlhf chat`` on the slave side of a pty, as a user's terminal runs it (echo, CR-LF output)."""

    def __init__(self, *args: str) -> None:
        self.master, slave = os.openpty()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        self.process = subprocess.Popen([sys.executable, "-m", "rlhf", "chat", *args], stdin=slave, stdout=slave,
                                        stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.buffer = ""

    def read_until(self, marker: str, timeout: float = 180) -> str:
        """Everything the terminal shows up to ``marker`` (consumed), with CR-LF read as LF."""
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {marker!r} within {timeout}s; the terminal shows:\n{self.buffer}")
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"rlhf chat ended before {marker!r}; the terminal shows:\n{self.buffer}")
            self.buffer += chunk.decode("utf-8", errors="replace").replace("\r\n", "\n")
        shown, self.buffer = self.buffer.split(marker, 1)
        return shown

    def say(self, line: str) -> str:
        """Type ``line``; returns the streamed reply (what the terminal shows after 'Assistant: ' up to the next prompt)."""
        os.write(self.master, (line + "\n").encode())
        shown = self.read_until("\nUser: ")
        return shown.split("Assistant: ", 1)[1] if "Assistant: " in shown else shown

    def close(self) -> int:
        try:
            return self.process.wait(timeout=60)
        finally:
            os.close(self.master)


def greedy_reply(model_path: Path, history: list[dict[str, str]], lora_path: Path | None = None) -> str:
    """The reference: transformers' greedy decode of the chat-templated conversation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if lora_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, lora_path)
    ids = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True, return_dict=False)
    out = model.eval().generate(torch.tensor([ids]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                repetition_penalty=float(PENALTY), pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)


@pytest.mark.slow
def test_chat_streams_the_greedy_reply_keeps_history_and_resets(tiny_causal_lm_path: Path) -> None:
    terminal = Terminal("--model", str(tiny_causal_lm_path), "--temperature", "0", "--max_new_tokens", str(MAX_NEW_TOKENS),
                        "--repetition_penalty", PENALTY)
    banner = terminal.read_until("User: ")
    assert "/reset" in banner and "/exit" in banner
    first, second = "what is 12+30?", "please compute 7+5"
    reply = terminal.say(first)
    assert reply.strip(), "the tiny model's greedy reply is empty: the comparison would prove nothing"
    assert reply.removesuffix("\n") == greedy_reply(tiny_causal_lm_path, [{"role": "user", "content": first}])
    history = [{"role": "user", "content": first}, {"role": "assistant", "content": reply.removesuffix("\n")},
               {"role": "user", "content": second}]
    assert terminal.say(second).removesuffix("\n") == greedy_reply(tiny_causal_lm_path, history)
    assert "(new conversation)" in terminal.say("/reset")
    assert terminal.say(second).removesuffix("\n") == greedy_reply(tiny_causal_lm_path, [{"role": "user", "content": second}])
    os.write(terminal.master, b"/exit\n")
    assert terminal.close() == 0


@pytest.mark.slow
def test_chat_with_a_lora_adapter_and_openrlhf_flags(tiny_causal_lm_path: Path, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32)
    adapter = tmp_path / "adapter"
    # non-zero B matrices, so the adapter changes the replies
    get_peft_model(base, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
                   ).save_pretrained(adapter)
    # OpenRLHF's interactive_chat spelling: --pretrain and --greedy_sampling
    terminal = Terminal("--pretrain", str(tiny_causal_lm_path), "--lora_path", str(adapter), "--greedy_sampling",
                        "--max_new_tokens", str(MAX_NEW_TOKENS), "--repetition_penalty", PENALTY)
    banner = terminal.read_until("User: ")
    assert "OpenRLHF's old flags were translated" in banner and "rlhf chat --model" in banner
    message = [{"role": "user", "content": "what is 12+30?"}]
    reply = terminal.say(message[0]["content"]).removesuffix("\n")
    assert reply == greedy_reply(tiny_causal_lm_path, message, lora_path=adapter)
    assert reply != greedy_reply(tiny_causal_lm_path, message)  # the adapter is in use
    os.write(terminal.master, b"\x04")  # Ctrl-D
    assert terminal.close() == 0


@pytest.mark.parametrize(("argv", "names"), [
    (["--max_new_tokens", "0"], ["--max_new_tokens"]),
    (["--max_new_tokens", "64", "--max_len", "32"], ["--max_new_tokens", "--max_len"]),
    (["--input_template", "no placeholder"], ["--input_template"]),
    (["--lora_path", "/nonexistent/adapter"], ["--lora_path", "/nonexistent/adapter"]),
])
def test_bad_flags_are_one_line_errors(argv: list[str], names: list[str]) -> None:
    assert_user_error(run_rlhf("chat", "--model", "/nonexistent/model", *argv, timeout=120), *names)


def test_a_model_that_cannot_load_is_a_user_error(tmp_path: Path) -> None:
    """Exit 2 and one ``rlhf: error:`` line naming --model and the path; in this process (it never reaches the
    terminal), so it costs no interpreter and no torch import of its own."""
    result = run_in_process("chat", "--model", str(tmp_path / "missing"))
    assert_user_error(result, "--model", str(tmp_path / "missing"))
