"""Train a draft head (export/draft_head.py) for a model by self-distillation: export-time only, torch.

1. Answers: the float model answers a fixed set of synthetic chat and code prompts greedily (batched). Its own
   answers are exactly the text the runtime will ask the head to continue, so labels are the model's choices, not
   some corpus's. No benchmark prompt is among them.
2. Features: one forward pass per conversation gives the final hidden rows (after the final norm, as the head
   reads them at run time).
3. Training: from the hidden row at position t and the token at t+1, the head predicts t+2, then recurs on its own
   state for `depth` steps (teacher forcing the tokens in between), cross-entropy weighted 0.8^step over its
   vocabulary: the tokens the answers use.

    python -m edge.export.draft_head_train SOURCE.gguf -o head.npz [--answers answers.json ...]

About 25 minutes for SmolLM2-135M on 2 cores (answers 2 x 13 min, features 6 min, training 5 epochs ~7 min).
The shipped export/heads/smollm2-135m-instruct.npz was trained with --epochs 4 on the answers to all of prompt set 0
and the first 288 prompts of set 1 (its meta records 1,288 answers).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from edge.export.draft_head import DraftHeadWeights, tokenizer_sha256

SUBJECTS = ("photosynthesis;the Roman Empire;black holes;the water cycle;volcanoes;machine learning;the French "
            "Revolution;honey bees;climate change;the human heart;electric cars;the printing press;coffee;chess;the "
            "moon landing;rainforests;vaccines;the stock market;jazz music;the Internet;earthquakes;dinosaurs;the "
            "Great Wall of China;recycling;sleep;meditation;the solar system;democracy;renewable energy;ancient "
            "Egypt;the immune system;bread baking;gardening;soccer;the Olympic Games;smartphones;oceans;glaciers;the "
            "Renaissance;friendship;time management;public speaking;learning a language;saving money;running a "
            "marathon;cats;dogs;trees;the periodic table;gravity;rainbows;tea;the brain;robots;airplanes;trains;"
            "libraries;museums;mountains;deserts").split(";")
CODE_TASKS = ("reverses a string;checks whether a number is prime;sorts a list of dictionaries by a key;counts the "
              "words in a text;merges two sorted lists;computes the factorial of n;finds the largest element in a "
              "list;removes duplicates from a list;reads a CSV file and prints each row;converts Celsius to "
              "Fahrenheit;checks whether a string is a palindrome;computes the average of a list of numbers;"
              "flattens a nested list;returns the greatest common divisor of two numbers;counts the vowels in a "
              "string;implements binary search;returns the squares of the even numbers in a list;parses a date "
              "string;finds the second smallest number in a list;capitalizes every word in a sentence").split(";")
PROMPT_SETS = [
    (["What is {s}?", "Explain {s} to a child.", "Tell me three facts about {s}.", "Why is {s} important?",
      "Write a short poem about {s}.", "Give me a short story about {s}.", "What are the pros and cons of {s}?",
      "How does {s} work?", "Tell me about the history of {s}.", "Write a paragraph describing {s}.",
      "What should a beginner know about {s}?", "Give me some tips related to {s}.", "Describe {s} in simple terms.",
      "What are common misconceptions about {s}?", "Write a haiku about {s}."],
     ["Write a Python function that {c}.", "How do I write a function in Python that {c}?",
      "Write a JavaScript function that {c}.", "Show me Python code that {c}, with comments.",
      "Write a Python function that {c} and explain how it works."]),
    (["Can you explain {s} briefly?", "Write a blog post introduction about {s}.", "What would happen without {s}?",
      "Summarize what you know about {s}.", "Give me five interesting questions about {s}.",
      "Compare {s} with something similar.", "Write a letter to a friend about {s}.", "What is the future of {s}?",
      "List the key terms related to {s} and define them.", "Why do people find {s} interesting?"],
     ["Write a Python class that {c}.", "Explain step by step how to write code that {c}.",
      "Write a C function that {c}.", "Write a short Python script that {c}, then show an example call."]),
]


def prompts(which: int) -> list[str]:
    chat, code = PROMPT_SETS[which]
    out = [t.format(s=s) for t in chat for s in SUBJECTS] + [t.format(c=c) for t in code for c in CODE_TASKS]
    random.Random(0).shuffle(out)
    return out


def load_reference(source: Path):
    import torch
    import transformers

    torch.set_num_threads(2)
    kwargs = {"gguf_file": source.name} if source.suffix == ".gguf" else {}
    folder = str(source.parent if source.suffix == ".gguf" else source)
    tok = transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
    return tok, model


def answer(tok, model, texts: list[str], new_tokens: int = 128, batch: int = 32) -> list[dict]:
    """The model's own greedy answers: the text the head will continue at run time."""
    import torch

    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = []
    for i in range(0, len(texts), batch):
        chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                 for p in texts[i:i + batch]]
        enc = tok(chats, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        for j in range(len(chats)):
            ids = enc["input_ids"][j][enc["attention_mask"][j].bool()].tolist()
            ans = out[j, enc["input_ids"].shape[1]:].tolist()
            if tok.eos_token_id in ans:
                ans = ans[:ans.index(tok.eos_token_id) + 1]
            rows.append({"prompt": texts[i + j], "ids": ids, "answer": ans})
    return rows


def features(model, rows: list[dict]) -> list[tuple]:
    """(tokens, final hidden rows from the last prompt token on, that position) per conversation."""
    import torch

    out = []
    with torch.no_grad():
        for r in rows:
            z = torch.tensor([r["ids"] + r["answer"]])
            h = model.model(input_ids=z).last_hidden_state[0]
            p = len(r["ids"]) - 1
            out.append((z[0], h[p:].clone(), p))
    return out


def train(model, feats: list[tuple], vocab_size: int, depth: int = 4, ffn: int = 1536, vocab: int = 4096,
          epochs: int = 5, lr: float = 1e-3, eps: float = 1e-5, seed: int = 0) -> tuple[DraftHeadWeights, dict]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    split = int(len(feats) * 0.9)
    counts = torch.zeros(vocab_size)
    for z, _, p in feats[:split]:
        counts.index_add_(0, z[p + 1:], torch.ones(len(z) - p - 1))
    ids = torch.argsort(counts, descending=True)[:min(vocab, int((counts > 0).sum()))]
    remap = torch.full((vocab_size,), -100, dtype=torch.long)
    remap[ids] = torch.arange(len(ids))
    emb = model.get_input_embeddings()(torch.arange(vocab_size)).detach()  # with any embedding scale
    out_rows = model.get_output_embeddings().weight.detach()[ids]
    d = emb.shape[1]
    fc1, fc2 = torch.nn.Linear(2 * d, ffn), torch.nn.Linear(ffn, d)
    torch.nn.init.zeros_(fc2.weight)
    torch.nn.init.zeros_(fc2.bias)
    n_in = torch.nn.Parameter(torch.ones(d))
    n_out = torch.nn.Parameter(model.model.norm.weight.detach().clone())
    params = [*fc1.parameters(), *fc2.parameters(), n_in, n_out]

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def step(s, y):
        s = s + fc2(F.silu(fc1(torch.cat([rms(s, n_in), emb[y]], -1))))
        return s, rms(s, n_out) @ out_rows.T

    def samples(part):
        hs, ys = [], []
        for z, h, p in part:
            m = len(z) - p - depth - 1
            if m > 0:
                hs.append(h[:m])
                ys.append(torch.stack([z[p + 1 + k: p + 1 + k + m] for k in range(depth + 1)], 1))
        return torch.cat(hs), torch.cat(ys)

    def chain_accuracy(hs, ys):
        """Share of positions where the head's own chain is right for 1..depth tokens."""
        with torch.no_grad():
            s, y, alive, acc = hs, ys[:, 0], torch.ones(len(hs), dtype=torch.bool), []
            for k in range(depth):
                s, logits = step(s, y)
                y = ids[logits.argmax(-1)]
                alive &= y == ys[:, k + 1]
                acc.append(round(float(alive.float().mean()), 4))
            return acc

    h_train, y_train = samples(feats[:split])
    h_held, y_held = samples(feats[split:])
    batch = 256
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    total = epochs * (len(h_train) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=total, pct_start=0.05)
    for _ in range(epochs):
        perm = torch.randperm(len(h_train))
        for b in range(0, len(h_train) - batch + 1, batch):
            idx = perm[b:b + batch]
            s, ys, loss = h_train[idx], y_train[idx], 0.0
            for k in range(depth):
                s, logits = step(s, ys[:, k])
                loss = loss + F.cross_entropy(logits, remap[ys[:, k + 1]], ignore_index=-100) * 0.8 ** k
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    report = {"train_positions": len(h_train), "held_out_positions": len(h_held),
              "train_chain_accuracy": chain_accuracy(h_train[:10000], y_train[:10000]),
              "held_out_chain_accuracy": chain_accuracy(h_held, y_held), "epochs": epochs, "ffn": ffn}
    t = lambda x: x.detach().numpy()  # noqa: E731
    weights = DraftHeadWeights(t(fc1.weight).astype(np.float16), t(fc1.bias).astype(np.float16),
                               t(fc2.weight).astype(np.float16), t(fc2.bias).astype(np.float16),
                               t(n_in).astype(np.float32), t(n_out).astype(np.float32), t(ids).astype(np.int32),
                               {"depth": depth, "eps": eps})
    return weights, report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="the model (GGUF file or Hugging Face folder)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the weights file to write (.npz)")
    ap.add_argument("--answers", type=Path, nargs="*", default=[],
                    help="answers files (JSON) to read or, where missing, to write: one per prompt set")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--depth", type=int, default=4)
    args = ap.parse_args(argv)
    from edge.export.load import load_model

    tok, model = load_reference(args.source)
    rows = []
    for which in range(len(PROMPT_SETS)):
        cache = args.answers[which] if which < len(args.answers) else None
        if cache is not None and cache.exists():
            part = json.loads(cache.read_text())
        else:
            start = time.time()
            part = answer(tok, model, prompts(which))
            print(f"prompt set {which}: {len(part)} answers in {time.time() - start:.0f} s", flush=True)
            if cache is not None:
                cache.write_text(json.dumps(part))
        rows += part
    random.Random(1).shuffle(rows)
    weights, report = train(model, features(model, rows), model.config.vocab_size, depth=args.depth,
                            epochs=args.epochs)
    imported = load_model(args.source)
    weights.meta.update(hidden_size=imported.config.hidden_size, vocab_size=imported.config.vocab_size,
                        tokenizer_sha256=tokenizer_sha256(imported.tokenizer_json),
                        trained={"source": args.source.name, "answers": len(rows), **report})
    weights.check(imported.config, imported.tokenizer_json)
    weights.save(args.out)
    print(json.dumps(weights.meta["trained"]), flush=True)


if __name__ == "__main__":
    main()
