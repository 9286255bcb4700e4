#!/usr/bin/env python3
"""The GPU check's peer: Hugging Face transformers on the same GGUF (it dequantizes at load),
greedy decode at the same batch sizes, output tokens per second. Writes JSON; when transformers
cannot load the file (no `gguf` package, no GPU) it says why and exits 0, so the check goes on.

    gpu-check-peer.py --model FILE --batch 1,4,16 --tokens 32 --json OUT
"""
import argparse
import json
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    out = {"peer": "transformers", "model": os.path.basename(a.model)}
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        folder, name = os.path.split(os.path.abspath(a.model))
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float16).cuda().eval()
        out.update(available=True, transformers=transformers.__version__, torch=torch.__version__, dtype="float16")
    except Exception as e:  # noqa: BLE001 - any reason the peer cannot run is reported, not raised
        out.update(available=False, why=f"{type(e).__name__}: {e}"[:500])
        json.dump(out, open(a.json, "w"), indent=2)
        print(json.dumps(out))
        return 0
    figures = []
    with torch.inference_mode():
        for b in [int(x) for x in a.batch.split(",")]:
            ids = torch.full((b, 16), 1, dtype=torch.long, device="cuda")
            kw = dict(max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False, pad_token_id=0)
            model.generate(ids, **kw)
            torch.cuda.synchronize()
            t = time.perf_counter()
            model.generate(ids, **kw)
            torch.cuda.synchronize()
            figures.append({"batch": b, "output_tok_s": b * a.tokens / (time.perf_counter() - t)})
    out["decode"] = figures
    json.dump(out, open(a.json, "w"), indent=2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
