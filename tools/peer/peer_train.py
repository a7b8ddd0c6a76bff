#!/usr/bin/env python3
"""A plain PyTorch transformer trained at the harness's budget: the peer check.

It trains the architecture of the harness's `baseline` variant (4 blocks of
multi-head self-attention and a d -> 4d -> d GELU feed-forward, masked mean
pooling and a d -> d -> classes GELU head for classification, a tied head for
language modelling) with the same steps, batch, peak learning rate, warm-up
and clipping, on an aclImdb-layout corpus or on WikiText-layout token files,
and prints its test metric. With --chiar-db it prints the harness's metric
for the matching runs next to its own.

Its defaults are a textbook PyTorch recipe (pre-LN blocks, learned absolute
positions, nn.Embedding's N(0, 1) initialisation, AdamW betas (0.9, 0.999),
weight decay 0.01 on every matrix but the embedding, cosine to 0). Each
`--harness-*` flag switches one of those to the harness's choice, so one
difference at a time can be measured (docs/method.md, "Training recipe").

Not part of the build or of CI. Needs Debian's python3-torch (and
python3-sentencepiece for --spm-model). On CPUs where OpenBLAS would pick a
slow core type, set OPENBLAS_CORETYPE (this script warns when it is unset).

  python3 tools/peer/peer_train.py imdb ../shared/data/imdb/aclImdb_labelled.tar.gz \
      --tokenizer bytes --max-len 512 --steps 500 --batch 16 --lr 2e-3 --warmup 50 --seeds 0 1 2
  python3 tools/peer/peer_train.py lm ../shared/data/wikitext-2 --train-file wiki.valid.tokens \
      --valid-fraction 0.1 --min-count 2 --max-len 128 --dropout 0.1 --steps 400 --batch 32 \
      --lr 1e-3 --warmup 40 --seeds 0 1 2 --chiar-db results/repro.db --chiar-runs 'baseline/wikitext2/*'
"""
import argparse
import ctypes
import math
import os
import random
import sqlite3
import sys
import tarfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- data -------------------------------------------------------------------

def read_aclimdb(path):
    """{'train': [(text, label)], 'test': [...]} from a folder or a .tar.gz."""
    splits = {"train": [], "test": []}

    def add(name, data):
        parts = name.split("/")
        if len(parts) < 4 or not name.endswith(".txt"):
            return
        split, sub = parts[-3], parts[-2]
        if split in splits and sub in ("neg", "pos"):
            text = data.decode("utf-8", errors="replace").replace("<br />", " ")
            splits[split].append((name, text, 1 if sub == "pos" else 0))

    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for f in files:
                full = os.path.join(root, f)
                with open(full, "rb") as fh:
                    add(full.replace(os.sep, "/"), fh.read())
    else:
        with tarfile.open(path, "r:gz") as tar:
            for m in tar:
                if m.isfile():
                    add(m.name, tar.extractfile(m).read())
    for split in splits:
        splits[split].sort()
        splits[split] = [(t, y) for _, t, y in splits[split]]
        if not splits[split]:
            sys.exit(f"peer: {path} has no {split}/neg or {split}/pos reviews")
    return splits


class Encoder:
    """Bytes (0-255, pad 256, as the harness's bytes tokenizer) or a trained
    sentencepiece model (pad 0), e.g. the spm-*.model the harness cached."""

    def __init__(self, kind, spm_model):
        self.kind = kind
        if kind == "spm":
            import sentencepiece
            self.sp = sentencepiece.SentencePieceProcessor(model_file=spm_model)
            self.vocab, self.pad = self.sp.get_piece_size(), 0
        else:
            self.vocab, self.pad = 257, 256

    def encode(self, text):
        return self.sp.encode(text) if self.kind == "spm" else list(text.encode("utf-8"))


def pad_batch(seqs, max_len, pad):
    seqs = [s[:max_len] for s in seqs]
    width = max(1, max(len(s) for s in seqs))
    x = torch.full((len(seqs), width), pad, dtype=torch.long)  # (B, T)
    for i, s in enumerate(seqs):
        x[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return x, x != pad


def read_lm(folder, files, min_count, train_file=None, valid_fraction=0.0):
    """Word-level WikiText-layout splits with <eos> per line; words seen fewer
    than min_count times in training become <unk> (the harness's word tokenizer).
    As the harness's wikitext task: train_file replaces the train split's file,
    and valid_fraction > 0 keeps the last fraction of its lines for validation
    (the test split is always its own file)."""
    lines = {}
    for split in ("train", "valid", "test"):
        name = train_file if split == "train" and train_file else files.format(split=split)
        if split == "valid" and valid_fraction > 0:
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            lines[split] = fh.read().split("\n")
            if lines[split] and lines[split][-1] == "":
                lines[split].pop()  # the newline ending the last line starts no line
    if valid_fraction > 0:
        n_valid = int(valid_fraction * len(lines["train"]) + 0.5)
        lines["train"], lines["valid"] = lines["train"][:-n_valid], lines["train"][-n_valid:]
    text = {split: [w for line in ls for w in line.split() + ["<eos>"]]  # blank lines too, as WikiText counts
            for split, ls in lines.items()}
    counts = {}
    for w in text["train"]:
        counts[w] = counts.get(w, 0) + 1
    vocab = ["<pad>", "<unk>", "<eos>"] + sorted(w for w, c in counts.items()
                                               if c >= min_count and w not in ("<unk>", "<eos>", "<pad>"))
    ids = {w: i for i, w in enumerate(vocab)}
    return len(vocab), {s: torch.tensor([ids.get(w, 1) for w in ws]) for s, ws in text.items()}


# ---- model ------------------------------------------------------------------

def rotate(x, base=10000.0):
    """RoPE, half-split pairs (feature i with i + dh/2), as the harness's attention."""
    T, dh = x.size(-2), x.size(-1)
    freq = base ** (-torch.arange(0, dh // 2, dtype=torch.float32) * 2 / dh)          # (dh/2,)
    angle = torch.arange(T, dtype=torch.float32)[:, None] * freq[None, :]             # (T, dh/2)
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., : dh // 2], x[..., dh // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, d, heads, post_ln, rope, dropout):
        super().__init__()
        self.heads, self.post_ln, self.rope = heads, post_ln, rope
        self.drop = nn.Dropout(dropout)  # on the FFN's output, as the harness's FeedForward
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def attend(self, x, valid, causal):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # (B, h, T, dh) each
        if self.rope:
            q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)                      # (B, h, T, T)
        if causal:
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        if valid is not None:
            scores = scores.masked_fill(~valid[:, None, None, :], torch.finfo(scores.dtype).min)
        o = scores.softmax(-1) @ v                                                         # (B, h, T, dh)
        return self.out(o.transpose(1, 2).reshape(B, T, d))

    def forward(self, x, valid, causal):
        ffn = lambda h: self.drop(self.down(F.gelu(self.up(h))))
        if self.post_ln:  # y = LN(x + f(x)), the harness's blocks
            x = self.norm1(x + self.attend(x, valid, causal))
            return self.norm2(x + ffn(x))
        x = x + self.attend(self.norm1(x), valid, causal)
        return x + ffn(self.norm2(x))


class Peer(nn.Module):
    def __init__(self, vocab, d, heads, layers, max_len, classes, args):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        if args.harness_embed_init:
            nn.init.normal_(self.embed.weight, 0.0, 0.02)
        self.pos = None if args.harness_rope else nn.Parameter(torch.randn(max_len, d) * 0.02)
        self.drop = nn.Dropout(args.dropout)  # after the embedding, as the harness's
        self.blocks = nn.ModuleList(Block(d, heads, args.harness_post_ln, args.harness_rope, args.dropout)
                                    for _ in range(layers))
        self.final = nn.Identity() if args.harness_post_ln else nn.LayerNorm(d)
        self.classes = classes
        if classes:
            self.hidden, self.head = nn.Linear(d, d), nn.Linear(d, classes)
        if args.zero_bias:  # every Linear's bias 0 instead of U(-1/sqrt(in), 1/sqrt(in))
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

    def forward(self, x, valid):
        h = self.embed(x)                                                                  # (B, T, d)
        if self.pos is not None:
            h = h + self.pos[: x.size(1)]
        h = self.drop(h)
        for block in self.blocks:
            h = block(h, valid if self.classes else None, causal=not self.classes)
        h = self.final(h)
        if not self.classes:
            return h @ self.embed.weight.t()                                               # (B, T, V)
        w = valid.float().unsqueeze(-1)                                                    # (B, T, 1)
        pooled = (h * w).sum(1) / w.sum(1).clamp_min(1.0)                                  # (B, d)
        return self.head(F.gelu(self.hidden(pooled)))                                      # (B, C)


def optimizer(model, args):
    decay, rest = [], []
    for name, p in model.named_parameters():
        is_embedding = name.startswith("embed") or name == "pos"
        (decay if p.dim() >= 2 and (args.harness_decay_embeddings or not is_embedding) else rest).append(p)
    wd = 0.1 if args.harness_weight_decay else 0.01
    betas = (0.9, 0.95 if args.harness_beta2 else 0.999)
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=args.lr, betas=betas)


def lr_at(step, args):
    floor = 0.1 if args.harness_floor else 0.0
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# ---- training ---------------------------------------------------------------

def train(model, batch_at, args, log):
    opt = optimizer(model, args)
    model.train()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        loss = batch_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if (step + 1) % args.log_every == 0:
            log(f"step {step + 1}/{args.steps}  loss {loss.item():.4f}")
    model.eval()


def run_imdb(args, seed, log):
    data = read_aclimdb(args.data)
    enc = Encoder(args.tokenizer, args.spm_model)
    rng = random.Random(seed)
    train_set = [(enc.encode(t)[: args.max_len], y) for t, y in data["train"]]
    test = data["test"]
    if args.test_size:  # half of each class, drawn with a fixed seed (not the run's)
        pick = random.Random(12345)
        test = [r for label in (0, 1) for r in pick.sample([r for r in test if r[1] == label], args.test_size // 2)]
    test_set = [(enc.encode(t)[: args.max_len], y) for t, y in test]
    torch.manual_seed(seed)
    model = Peer(enc.vocab, args.d_model, args.heads, args.layers, args.max_len, 2, args)
    order = []

    def batch_at(step):
        nonlocal order
        if len(order) < args.batch:
            order = order + rng.sample(range(len(train_set)), len(train_set))
        idx, order = order[: args.batch], order[args.batch:]
        x, valid = pad_batch([train_set[i][0] for i in idx], args.max_len, enc.pad)
        y = torch.tensor([train_set[i][1] for i in idx])
        return F.cross_entropy(model(x, valid), y)

    train(model, batch_at, args, log)
    correct, rows = 0, []
    with torch.no_grad():
        for s in range(0, len(test_set), 64):
            chunk = test_set[s:s + 64]
            x, valid = pad_batch([c[0] for c in chunk], args.max_len, enc.pad)
            logits = model(x, valid)                                                       # (B, 2)
            pred = logits.argmax(-1)                                                       # (B,)
            correct += (pred == torch.tensor([c[1] for c in chunk])).sum().item()
            rows += [(s + i, c[1], int(p), float(l[1] - l[0])) for i, (c, p, l) in enumerate(zip(chunk, pred, logits))]
    if args.predictions:  # one line per test review, to compare models review by review
        with open(args.predictions, "a") as fh:
            fh.writelines(f"{seed},{i},{y},{p},{margin:.6g}\n" for i, y, p, margin in rows)
    return "test accuracy", 100.0 * correct / len(test_set)


def run_lm(args, seed, log):
    vocab, ids = read_lm(args.data, args.files, args.min_count, args.train_file, args.valid_fraction)
    log(f"vocabulary {vocab}, {ids['train'].numel()} training tokens, {ids['test'].numel()} test tokens")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = Peer(vocab, args.d_model, args.heads, args.layers, args.max_len, 0, args)
    train_ids, T = ids["train"], args.max_len

    def batch_at(step):
        starts = torch.randint(0, train_ids.numel() - T - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + T] for s in starts.tolist()])                  # (B, T)
        y = torch.stack([train_ids[s + 1:s + T + 1] for s in starts.tolist()])          # (B, T)
        return F.cross_entropy(model(x, None).reshape(-1, vocab), y.reshape(-1))

    train(model, batch_at, args, log)
    test, total, count = ids["test"], 0.0, 0
    with torch.no_grad():  # non-overlapping windows over the whole test split
        for s in range(0, test.numel() - 1, T):
            x = test[s:min(s + T, test.numel() - 1)][None]
            y = test[s + 1:s + 1 + x.size(1)][None]
            total += F.cross_entropy(model(x, None)[0], y[0], reduction="sum").item()
            count += y.numel()
    return "test perplexity", math.exp(total / count)


def chiar_metrics(db, run_glob):
    """(run name, metric, value) of the harness's finished runs matching the glob."""
    import fnmatch
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT r.name, m.name, m.value FROM runs r JOIN metrics m ON m.run_id = r.id "
        "WHERE r.status = 'done' AND m.split = 'test' AND m.checkpoint = 'last' "
        "AND m.name IN ('accuracy', 'token_ppl') ORDER BY 1").fetchall()
    con.close()
    return [r for r in rows if fnmatch.fnmatch(r[0], run_glob)]


def keep_freed_memory():
    """glibc's malloc serves blocks above 32 MiB (attention scores, logits)
    with mmap and unmaps them on free, so every step page-faults them in
    afresh; on the virtual machines here that made a byte-level IMDB step
    several times slower (mostly system time). The harness keeps freed memory
    in the process for the same reason (docs/performance.md, 'Allocator');
    the peer does the same, so neither side pays it. MALLOC_MMAP_MAX_ /
    MALLOC_TRIM_THRESHOLD_ in the environment, if set, win."""
    if "MALLOC_MMAP_MAX_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to set
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["imdb", "lm"])
    p.add_argument("data", help="aclImdb folder or .tar.gz (imdb); WikiText-layout folder (lm)")
    p.add_argument("--tokenizer", choices=["bytes", "spm"], default="bytes")
    p.add_argument("--spm-model", help="sentencepiece .model (the harness caches its own as spm-*.model)")
    p.add_argument("--files", default="wiki.{split}.tokens")
    p.add_argument("--min-count", type=int, default=1)
    p.add_argument("--train-file", help="lm: the file the train split reads instead (the harness's train_file)")
    p.add_argument("--valid-fraction", type=float, default=0.0,
                   help="lm: the train file's last fraction of lines validates (the harness's valid_fraction)")
    p.add_argument("--max-len", type=int, default=512, help="tokens per review, or the LM window")
    p.add_argument("--test-size", type=int, default=0)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0, help="after the embedding and on each FFN's output")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    for flag, what in [("post-ln", "blocks y = LN(x + f(x)) instead of pre-LN"),
                       ("rope", "RoPE in attention instead of learned absolute positions"),
                       ("embed-init", "embeddings drawn from N(0, 0.02^2) instead of N(0, 1)"),
                       ("beta2", "AdamW beta2 0.95 instead of 0.999"),
                       ("weight-decay", "weight decay 0.1 instead of 0.01"),
                       ("decay-embeddings", "weight decay on the embeddings too"),
                       ("floor", "cosine to 0.1 lr instead of 0")]:
        p.add_argument(f"--harness-{flag}", action="store_true", help=f"the harness's choice: {what}")
    p.add_argument("--zero-bias", action="store_true", help="start every Linear's bias at 0 (PyTorch: uniform)")
    p.add_argument("--harness", action="store_true", help="every --harness-* choice at once")
    p.add_argument("--predictions", help="imdb: append seed,review,label,prediction,logit margin per test review")
    p.add_argument("--chiar-db", help="a chiar store: print its test metric for --chiar-runs next to this one")
    p.add_argument("--chiar-runs", default="baseline/*")
    args = p.parse_args()
    if args.harness:
        for k in vars(args):
            if k.startswith("harness_"):
                setattr(args, k, True)
    if args.tokenizer == "spm" and not args.spm_model:
        p.error("--tokenizer spm needs --spm-model")
    if "OPENBLAS_CORETYPE" not in os.environ:
        print("peer: OPENBLAS_CORETYPE is unset; on some CPUs OpenBLAS then runs its products ~5x slower "
              "(e.g. export OPENBLAS_CORETYPE=Haswell)", file=sys.stderr)
    keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    choices = [k[len("harness_"):] for k, v in vars(args).items() if k.startswith("harness_") and v]
    print(f"peer: torch {torch.__version__}, {torch.get_num_threads()} threads, harness choices: "
          f"{', '.join(choices) or 'none'}")
    values = []
    for seed in args.seeds:
        start = time.time()
        log = lambda msg: print(f"  seed {seed}  {msg}", flush=True)
        metric, value = (run_imdb if args.kind == "imdb" else run_lm)(args, seed, log)
        values.append(value)
        print(f"peer seed={seed}  {metric} {value:.2f}  ({time.time() - start:.0f} s)", flush=True)
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    print(f"peer mean over {len(values)} seeds: {mean:.2f} (sd {sd:.2f})")
    if args.chiar_db:
        rows = chiar_metrics(args.chiar_db, args.chiar_runs)
        for name, metric, value in rows:  # accuracy is stored as a fraction
            shown = 100.0 * value if metric == "accuracy" else value
            print(f"chiar {name}  test {'accuracy' if metric == 'accuracy' else 'perplexity'} {shown:.2f}")
        if not rows:
            print(f"chiar: no finished run in {args.chiar_db} matches '{args.chiar_runs}'")


if __name__ == "__main__":
    main()
