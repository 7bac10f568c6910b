"""Real PyTorch for the colocation check: `colocation.py serve REQUEST_MS DUTY` or `colocation.py train`.

Both build a small decoder-only transformer from a config, with random weights (nothing is downloaded).
`serve` answers inference requests: a forward pass over a batch of prompts in bfloat16, each prompt's next
token copied back to the host. `train` runs training steps on random tokens: forward and backward under
bfloat16 autocast, AdamW. Each prints `loaded` once set up, then follows commands, one a line on stdin,
answering each with `key=value` lines and `done <the command>`:

  calibrate            (serve) the batch whose request takes about REQUEST_MS alone: request_batch=,
                       request_ms= (the median of that batch's requests)
  warm                 (train) a few steps: step_ms=
  run PHASE SECONDS    serve: a request every request_ms / DUTY for SECONDS, each timed from its start to its
                       tokens on the host: PHASE_requests= PHASE_p50_ms= PHASE_p99_ms= PHASE_max_ms=
                       PHASE_busy= (the requests' time over the window); train: PHASE_steps= PHASE_seconds=

It ends at the end of its input. `skip=<reason>` when PyTorch or a GPU is missing.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from workload import torch_or_skip  # type: ignore[import-not-found]  # beside this script

SERVE = {"vocab": 32000, "d_model": 768, "heads": 12, "layers": 6, "seq": 128}
TRAIN = {"vocab": 8192, "d_model": 512, "heads": 8, "layers": 4, "seq": 256, "batch": 16}
MAX_BATCH = 512
WARM_STEPS = 10


def decoder(torch: Any, cfg: dict[str, int]) -> Any:
    """A decoder-only transformer of the config: token and position embeddings, pre-norm causal blocks,
    a final norm and the vocabulary head (applied by the caller: to the last position only when serving)."""
    nn = torch.nn

    class Decoder(nn.Module):  # type: ignore[misc, name-defined, unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            d = cfg["d_model"]
            self.embed = nn.Embedding(cfg["vocab"], d)
            self.pos = nn.Embedding(cfg["seq"], d)
            layer = nn.TransformerEncoderLayer(
                d, cfg["heads"], 4 * d, dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, cfg["vocab"], bias=False)
            mask = nn.Transformer.generate_square_subsequent_mask(cfg["seq"])
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, tokens: Any) -> Any:
            n = tokens.shape[1]
            x = self.embed(tokens) + self.pos(torch.arange(n, device=tokens.device))
            mask = self.mask[:n, :n].to(x.dtype)
            return self.norm(self.blocks(x, mask=mask, is_causal=True))

    return Decoder()


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: a value that occurred (as the check's `timeline.percentile`)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


class Server:
    def __init__(self, torch: Any, request_ms: float, duty: float) -> None:
        self.torch = torch
        self.target_s = request_ms / 1000
        self.duty = duty
        dev = torch.device("cuda")
        self.model = decoder(torch, SERVE).to(dev, dtype=torch.bfloat16).eval()
        self.prompts = torch.randint(0, SERVE["vocab"], (MAX_BATCH, SERVE["seq"]), device=dev)
        self.batch = 1
        self.request_s = 0.0

    def request(self, batch: int) -> float:
        torch = self.torch
        began = time.perf_counter()
        with torch.inference_mode():
            hidden = self.model(self.prompts[:batch])
            tokens = self.model.head(hidden[:, -1]).argmax(-1)
        tokens.cpu()  # the answer on the host: the request is done
        return time.perf_counter() - began

    def median(self, batch: int, n: int = 15) -> float:
        for _ in range(3):
            self.request(batch)
        return statistics.median(self.request(batch) for _ in range(n))

    def calibrate(self) -> None:
        """The batch whose request takes about the target alone: doubled until one is long enough, then halved
        in on it."""
        lo, hi = 0, 1
        while hi < MAX_BATCH and self.median(hi) < self.target_s:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.median(mid) < self.target_s else (lo, mid)
        self.batch = hi
        self.request_s = self.median(hi, 50)
        print(f"request_batch={self.batch}\nrequest_ms={self.request_s * 1000:.4f}")
        print(f"config={','.join(f'{k}:{v}' for k, v in SERVE.items())}")

    def run(self, phase: str, seconds: float) -> None:
        period = (self.request_s or self.target_s) / self.duty
        latencies: list[float] = []
        began = time.perf_counter()
        end, due = began + seconds, began
        while (now := time.perf_counter()) < end:
            if due > now:
                time.sleep(due - now)
            latencies.append(self.request(self.batch))
            due = max(due + period, time.perf_counter())  # a late request is not made up for by a burst
        window = time.perf_counter() - began
        ms = [t * 1000 for t in latencies]
        print(f"{phase}_requests={len(ms)}\n{phase}_p50_ms={percentile(ms, 50):.4f}")
        print(f"{phase}_p99_ms={percentile(ms, 99):.4f}\n{phase}_max_ms={max(ms):.4f}")
        print(f"{phase}_busy={sum(latencies) / window:.5f}")


class Trainer:
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        dev = torch.device("cuda")
        self.model = decoder(torch, TRAIN).to(dev).train()
        self.tokens = torch.randint(0, TRAIN["vocab"], (TRAIN["batch"], TRAIN["seq"] + 1), device=dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def step(self) -> None:
        torch, vocab = self.torch, TRAIN["vocab"]
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model.head(self.model(self.tokens[:, :-1]))
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, vocab), self.tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        self.opt.step()
        torch.cuda.synchronize()

    def warm(self) -> None:
        for _ in range(WARM_STEPS):
            self.step()
        began = time.perf_counter()
        for _ in range(WARM_STEPS):
            self.step()
        print(f"step_ms={(time.perf_counter() - began) / WARM_STEPS * 1000:.4f}")
        print(f"config={','.join(f'{k}:{v}' for k, v in TRAIN.items())}")

    def run(self, phase: str, seconds: float) -> None:
        began = time.perf_counter()
        steps = 0
        while time.perf_counter() - began < seconds:
            self.step()
            steps += 1
        print(f"{phase}_steps={steps}\n{phase}_seconds={time.perf_counter() - began:.6f}")


def follow(commands: dict[str, Callable[..., None]]) -> None:
    while (line := sys.stdin.readline()).endswith("\n"):  # a last line without its end: the input closed
        words = line.split()
        if not words:
            continue
        command = commands.get(words[0])
        if command is None:
            print(f"colocation: unknown command {line.strip()!r}", file=sys.stderr, flush=True)
            continue
        command(*words[1:])
        print(f"done {' '.join(words)}", flush=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("serve", "train") or (argv[0] == "serve" and len(argv) != 3):
        print("usage: colocation.py serve REQUEST_MS DUTY | colocation.py train", file=sys.stderr)
        return 2
    torch = torch_or_skip()
    if torch is None:
        return 0
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    if argv[0] == "serve":
        server = Server(torch, float(argv[1]), float(argv[2]))
        print("loaded", flush=True)
        follow({"calibrate": server.calibrate, "run": lambda p, s: server.run(p, float(s))})
    else:
        trainer = Trainer(torch)
        print("loaded", flush=True)
        follow({"warm": trainer.warm, "run": lambda p, s: trainer.run(p, float(s))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
