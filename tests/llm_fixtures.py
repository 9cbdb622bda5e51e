"""A tiny randomly initialised chat model built here (no download): a byte-level BPE tokenizer trained in
milliseconds on LEIR and prompt text, a chat template, and a 2-layer Llama of a few thousand parameters. It
exercises the real `transformers` generation, TRL training and serving code paths in seconds."""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
CORPUS = ["L^{32}_{a=0}L^{32}_{c=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+A^{f32,g}_{a,d}*B^{f32,g}_{d,c};];",
          "loop_split(nest=0, loop=c, factor=32) loop_reorder(nest=0, order=[a,d,c]) stop()",
          "<think>The innermost loop walks memory with a stride.</think><answer>{\"transformed_IR\": \"\", "
          "\"applied_strategy\": \"loop_reorder\"}</answer>",
          "Here is a tensor program from the workload level1/matmul_square. Program: Tensors: input output"]


def tiny_chat_model(folder: Path, seed: int = 0) -> Path:
    """Write the model and tokenizer to `folder` (a `from_pretrained` folder) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
