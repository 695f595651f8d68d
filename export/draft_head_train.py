"""Train a draft head (export/draft_head.py) for a model by self-distillation: export-time only, torch.

1. Answers: the float model answers fixed sets of synthetic chat and code prompts greedily (batched): the kind of
   text the runtime will ask the head to continue. No benchmark prompt is among them.
2. Features: the final hidden rows (after the final norm, as the head reads them at run time) and the choice the
   target makes after each token. With --package, both come from the exported package the head will serve
   (`package_features`): a 4-bit target's greedy choice differs from the float model's text at ~13% of answer
   positions, and at run time only the target's own choices are accepted. Without it, from one float forward pass.
3. Training: from the hidden row at position t and the token at t+1, the head guesses the target's choice after
   it, then recurs on its own state for `depth` steps (teacher forcing the tokens in between; a step whose input
   the target would not have chosen gets no label), cross-entropy weighted 0.8^step over its vocabulary: the
   tokens the target chose.

    python -m edge.export.draft_head_train SOURCE.gguf -o head.npz [--answers a.json b.json c.json] [--package DIR]

On 2 cores for SmolLM2-135M: answers ~13 min per 1,000 prompts; features and 4 epochs on 2,240 answers ~34 min.
The shipped export/heads/smollm2-135m-instruct.npz: all three prompt sets (2,240 answers), --package the int4-edge
export, --epochs 4 (its meta records the data and the held-out chain accuracy).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
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
    (["I want to learn about {s}. Where should I start?", "Write a short essay about {s}.",
      "What are some fun facts about {s}?", "How would you describe {s} to someone from the past?",
      "Give me a quick overview of {s}.", "What questions do scientists still have about {s}?",
      "Write a short dialogue between two friends about {s}.", "What are common mistakes people make with {s}?",
      "Tell me a joke about {s}.", "What is the most surprising thing about {s}?"],
     ["Write a Python function that {c}.", "Write a function in Python that {c}, with a docstring.",
      "Write a Rust function that {c}.", "How can I write a program that {c}? Show the code.",
      "Write a TypeScript function that {c}.", "Write a Python function that {c}, and a test for it.",
      "Write a Java method that {c}.", "Explain how to write a Python function that {c}."],
     ("the violin;origami;the Amazon river;penguins;solar panels;the Eiffel Tower;yoga;photography;chocolate;"
      "comets;the Silk Road;hurricanes;mushrooms;the piano;skateboarding;pizza;the ancient Greeks;bridges;"
      "batteries;rivers;kites;tulips;wolves;whales;electricity;magnets;the compass;maps;castles;the Vikings;"
      "cheese;board games;camping;bird migration;the Arctic;rice farming;windmills;volleyball;owls;lighthouses"
      ).split(";"),
     ("counts how often each character appears in a string;checks whether two strings are anagrams;returns the "
      "n-th triangular number;converts a number to binary;validates an email address;finds the longest word in a "
      "sentence;rotates a list by k positions;computes the sum of the digits of a number;transposes a matrix;finds "
      "all divisors of a number;removes vowels from a string;checks whether a year is a leap year;groups a list of "
      "words by their first letter;returns the most common element in a list;computes the dot product of two "
      "vectors;splits a list into chunks of size n;checks whether a list is sorted;counts the lines in a file;"
      "generates a random password;converts a dictionary to a list of pairs").split(";")),
]


def prompts(which: int) -> list[str]:
    chat, code, *topics = PROMPT_SETS[which]
    subjects, tasks = topics or (SUBJECTS, CODE_TASKS)
    out = [t.format(s=s) for t in chat for s in subjects] + [t.format(c=c) for t in code for c in tasks]
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
    """Per conversation: its tokens, the final hidden rows from the last prompt token on, that position, and the
    choice after each token (here the float model's own next token)."""
    import torch

    out = []
    with torch.no_grad():
        for r in rows:
            z = torch.tensor([r["ids"] + r["answer"]])
            h = model.model(input_ids=z).last_hidden_state[0]
            p = len(r["ids"]) - 1
            out.append((z[0], h[p:].clone(), p, torch.cat([z[0, 1:], torch.tensor([-1])])))
    return out


def package_features(package_dir: Path, rows: list[dict], chunk: int = 64) -> list[tuple]:
    """As `features`, from the exported package the head will serve: its own hidden rows and its own greedy choice
    after each token, which is what the head must guess at run time. Measured on SmolLM2's int4-edge package: its
    choice differs from the float model's answer at 13% of answer positions (near-ties that 4-bit weights flip)."""
    import torch

    from edge.model import Decoder
    from edge.package import load_package

    longest = max(len(r["ids"]) + len(r["answer"]) for r in rows)
    decoder = Decoder(load_package(package_dir), context_length=longest, max_rows=chunk)
    if not any(o.name == "hidden" for o in decoder.session.get_outputs()):
        raise SystemExit(f"{package_dir} has no hidden output; re-export it with this version of edge")
    out = []
    for r in rows:
        z = r["ids"] + r["answer"]
        decoder.reset()
        hidden, choice = [], []
        for start in range(0, len(z), chunk):
            part = z[start:start + chunk]
            choice.append(decoder.step(part, logits_rows=range(len(part))).argmax(-1))
            hidden.append(decoder.hidden.copy())
        p = len(r["ids"]) - 1
        out.append((torch.tensor(z), torch.from_numpy(np.concatenate(hidden)[p:]), p,
                    torch.from_numpy(np.concatenate(choice))))
    return out


def samples(part: list[tuple], depth: int, vocab_size: int) -> tuple:
    """Training rows: the hidden row at each answer position, the tokens fed to the head's steps 1..depth (the
    root, then the tokens that followed) and the target's choice each step must guess. A step whose input left the
    target's own path (the text took a token the target would not have chosen) gets the marker vocab_size: no
    loss, the run time never feeds such a token."""
    import torch

    hs, xs, ts = [], [], []
    for z, h, p, choice in part:
        m = len(z) - p - depth - 1
        if m <= 0:
            continue
        x = torch.stack([z[p + 1 + k: p + 1 + k + m] for k in range(depth)], 1)
        t = torch.stack([choice[p + 1 + k: p + 1 + k + m] for k in range(depth)], 1).long()
        on_path = torch.cat([torch.ones(m, 1, dtype=torch.bool), x[:, 1:] == t[:, :-1]], 1).cumprod(1).bool()
        hs.append(h[:m])
        xs.append(x)
        ts.append(torch.where(on_path, t, vocab_size))
    return torch.cat(hs), torch.cat(xs), torch.cat(ts)


def train(model, feats: list[tuple], vocab_size: int, depth: int = 4, ffn: int = 1536, vocab: int = 4096,
          epochs: int = 5, lr: float = 1e-3, eps: float = 1e-5, seed: int = 0,
          log: Callable[[str], None] | None = None) -> tuple[DraftHeadWeights, dict]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    split = int(len(feats) * 0.9)
    h_train, x_train, t_train = samples(feats[:split], depth, vocab_size)
    h_held, x_held, t_held = samples(feats[split:], depth, vocab_size)
    chosen = t_train[t_train < vocab_size]
    counts = torch.bincount(chosen, minlength=vocab_size)
    ids = torch.argsort(counts, descending=True)[:min(vocab, int((counts > 0).sum()))]
    remap = torch.full((vocab_size + 1,), -100, dtype=torch.long)  # + the off-path marker
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

    def chain_accuracy(hs, xs, ts):
        """Share of positions where the head's own chain is right for 1..depth tokens."""
        with torch.no_grad():
            s, y, alive, acc = hs, xs[:, 0], torch.ones(len(hs), dtype=torch.bool), []
            for k in range(depth):
                s, logits = step(s, y)
                y = ids[logits.argmax(-1)]
                alive &= y == ts[:, k]
                acc.append(round(float(alive.float().mean()), 4))
            return acc

    batch = 256
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    total = epochs * (len(h_train) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=total, pct_start=0.05)
    for epoch in range(epochs):
        if log:
            log(f"epoch {epoch + 1}/{epochs}: {len(h_train)} positions")
        perm = torch.randperm(len(h_train))
        for b in range(0, len(h_train) - batch + 1, batch):
            idx = perm[b:b + batch]
            s, xs, ts, loss = h_train[idx], x_train[idx], t_train[idx], 0.0
            for k in range(depth):
                s, logits = step(s, xs[:, k])
                loss = loss + F.cross_entropy(logits, remap[ts[:, k]], ignore_index=-100) * 0.8 ** k
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    report = {"train_positions": len(h_train), "held_out_positions": len(h_held),
              "train_chain_accuracy": chain_accuracy(h_train[:10000], x_train[:10000], t_train[:10000]),
              "held_out_chain_accuracy": chain_accuracy(h_held, x_held, t_held), "epochs": epochs, "ffn": ffn}
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
    ap.add_argument("--package", type=Path,
                    help="the exported package the head will serve (an edge.model decoder graph with a `hidden` "
                         "output): train on its hidden rows and its own greedy choices instead of the float model's")
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
    start = time.time()
    feats = features(model, rows) if args.package is None else package_features(args.package, rows)
    print(f"features of {len(rows)} answers in {time.time() - start:.0f} s", flush=True)
    weights, report = train(model, feats, model.config.vocab_size, depth=args.depth, epochs=args.epochs,
                            log=lambda text: print(text, flush=True))
    imported = load_model(args.source)
    weights.meta.update(hidden_size=imported.config.hidden_size, vocab_size=imported.config.vocab_size,
                        tokenizer_sha256=tokenizer_sha256(imported.tokenizer_json),
                        trained={"source": args.source.name, "answers": len(rows),
                                 "features": "float model" if args.package is None else args.package.name, **report})
    weights.check(imported.config, imported.tokenizer_json)
    weights.save(args.out)
    print(json.dumps(weights.meta["trained"]), flush=True)


if __name__ == "__main__":
    main()
