#!/usr/bin/env python3
"""Writes the reference vectors Pacer's engine tests compare against, produced by llama.cpp
(llama-cpp-python) on the same GGUF:

  engine/tests/data/tokenizer_reference.json  token ids of a set of strings
  engine/tests/data/logits_reference.json     teacher-forced top-10 next-token logits at every
                                              position, from an f32 GGUF of the same weights

Also writes f32 / q8_0 / q4_0 GGUFs of the model next to the cache (llama.cpp's own quantizer,
from the dequantized tensors), which the logits reference and `scripts/bench-core.py` use.

Run through scripts/make-reference.sh, which builds llama.cpp and fetches the model first.
"""

import argparse
import ctypes
import json
import os
import sys

import jinja2
import llama_cpp
import numpy as np
from gguf import GGUFReader

TOP = 10

TOKENIZER_STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\ttabbed",
    "Numbers: 1234567890, 3.14159, -42 and 1e-5.",
    "Accents: café, naïve, Ærøskøbing, São Paulo, Zürich, résumé.",
    "CJK: 你好，世界。日本語のテキスト。한국어 문장.",
    "Emoji: 🙂🚀👩‍👩‍👧‍👦 🇫🇷 ✨",
    "Code: fn main() { let x: Vec<u32> = (0..10).map(|i| i * 2).collect(); }",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": None}  # comment",
    "<|im_start|>user\nHi<|im_end|>",
    "Mixed: don't won't it's I'm you're we've they'll he'd",
    "URL https://example.com/path?q=1&r=2#frag and email a.b@c.org",
]

CONVERSATION = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France? Answer in one word."},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Japan? 🇯🇵"},
]

LOGIT_PROMPTS = {
    "plain": "The capital of France is Paris. The capital of Germany is",
    "code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "unicode": "Voilà: le café coûte 3,50 €. 東京は日本の首都です。",
}


def render_chat(template: str, messages, add_generation_prompt: bool) -> str:
    env = jinja2.Environment()
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token="", eos_token=""
    )


def quantize(src: str, dst: str, ftype: int) -> None:
    if os.path.exists(dst):
        return
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize({dst}) failed: {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the GGUF as shipped (Q4_1)")
    ap.add_argument("--workdir", required=True, help="where to write the f32/q8_0/q4_0 GGUFs")
    ap.add_argument("--out", required=True, help="directory for the JSON vectors")
    args = ap.parse_args()

    stem = os.path.join(args.workdir, "SmolLM2-135M-Instruct")
    f32 = f"{stem}.f32.gguf"
    quantize(args.model, f32, llama_cpp.LLAMA_FTYPE_ALL_F32)
    quantize(f32, f"{stem}.q8_0.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0)
    quantize(f32, f"{stem}.q4_0.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0)

    template = GGUFReader(args.model).fields["tokenizer.chat_template"].contents()
    chat_text = render_chat(template, CONVERSATION, add_generation_prompt=True)

    vocab = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    strings = TOKENIZER_STRINGS + [chat_text]
    tok_ref = {
        "source": f"llama-cpp-python {llama_cpp.__version__}, tokenize(special=True, add_bos=False)",
        "cases": [{"text": s, "ids": vocab.tokenize(s.encode("utf-8"), add_bos=False, special=True)} for s in strings],
    }

    # f32 weights and an f32 KV cache, so the only differences left are summation order.
    llm = llama_cpp.Llama(
        model_path=f32, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, logits_all=True,
        type_k=0, type_v=0, flash_attn=False, verbose=False,
    )
    prompts = dict(LOGIT_PROMPTS)
    prompts["chat"] = chat_text
    logit_ref = {
        "source": f"llama-cpp-python {llama_cpp.__version__} on an f32 GGUF of the same weights, f32 KV cache",
        "top": TOP,
        "cases": [],
    }
    for name, text in prompts.items():
        ids = vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
        positions = []
        for row in scores:
            top = np.argsort(-row, kind="stable")[:TOP]
            positions.append({"ids": [int(i) for i in top], "logits": [float(row[i]) for i in top]})
        logit_ref["cases"].append({"name": name, "tokens": ids, "positions": positions})

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer_reference.json"), "w") as f:
        json.dump(tok_ref, f, ensure_ascii=False, indent=1)
    with open(os.path.join(args.out, "logits_reference.json"), "w") as f:
        json.dump(logit_ref, f, indent=None, separators=(",", ":"))
    print(f"wrote {len(tok_ref['cases'])} tokenizer cases and {len(logit_ref['cases'])} logit cases to {args.out}")


if __name__ == "__main__":
    main()
