"""The package's trained draft head (export/draft_head.py) drafts a chain from the target's own last hidden row.

No second model and no second KV cache: the head reads the hidden row behind the root's logits (the target graph
outputs it next to the logits) and the root token; each call of its one-step graph returns a guess, the head's
confidence in it and the state for the next step. The adaptive policy picks the depth as for a draft model; within
it the chain stops at the first guess the head itself doubts (confidence under `floor`; EAGLE-2's observation that
a draft head's confidence predicts acceptance), so an unsure first guess costs one head step and no verify rows
at all. Measured in the loop when the head was added: ~0.5 ms for the first step (its weights are out of cache after
each target step), ~0.25 ms for each further one; on a Zen 5 with the VNNI kernels (session 16) 0.15 and 0.11 ms
(IOBinding instead of run(): 0.12 ms, not worth the change).
"""

from __future__ import annotations

import numpy as np

from edge.errors import EdgeError
from edge.package import Package
from edge.session import create_session
from edge.speculative.drafter import Draft, Drafter


class DraftHead(Drafter):
    name = "head"
    follows_hidden = True

    def __init__(self, package: Package, floor: float = 0.5, device: str = "cpu"):
        """device: the target's. On the CPU the head's session has no worker thread of its own: one would wait for a
        core that the target session's spinning worker holds (session 10 measured 4.4 ms per draft call with 2
        threads; session 11, with the target's spinning stopped after each run, found no gain beyond the noise).
        On edge's kernels its ops run on the team the target's session started (kernels/README.md, Threads). On a
        GPU it runs there too: a GPU step is ~3 ms of dispatch, and the head's steps on the host's CPU took so much
        of it that it lost to plain decoding (benchmarks/RESULTS.md, session 12)."""
        record = package.draft_head
        if record is None:
            raise EdgeError(f"{package.root} has no draft head; export it with `edge-export SOURCE -o DIR "
                            f"--draft-head WEIGHTS.npz` (train the weights with `python -m "
                            f"edge.export.draft_head_train`), or choose a model-free drafter (--draft auto)")
        self.session = create_session(package.root / record["file"], device, 1, package.custom_ops, spin=False)
        self.depth, self.floor = int(record["depth"]), floor
        held_out = record.get("trained", {}).get("held_out_chain_accuracy")
        self.known_acceptance = float(held_out[0]) if held_out else None  # of all first guesses, confident or not
        width = package.config.hidden_size
        self.row: np.ndarray | None = None  # the followed hidden row, in a buffer of its own
        self._row = np.zeros((1, width), np.float32)
        # On the CPU each step's inputs and outputs live in buffers bound once, two sets taking turns (a step's
        # outputs are the next one's inputs): whatever runs between two target steps runs cold, and run()'s
        # per-call arrays cost ~30 us of a ~250 us step (session 19).
        self._state = np.zeros((2, 1, width), np.float32)
        self._token = np.zeros((2, 1), np.int64)
        self._confidence = np.zeros(1, np.float32)
        self._bindings = [self._bind(0, 1), self._bind(1, 0)] if device == "cpu" else None
        self._steps(0, 1)  # the first run allocates (~1.5 ms)

    def _bind(self, source: int, target: int):
        """A binding that reads buffer set `source` and writes set `target`."""
        binding = self.session.io_binding()
        binding.bind_cpu_input("state", self._state[source])
        binding.bind_cpu_input("token", self._token[source])
        for name, buffer in (("next_state", self._state[target]), ("next_token", self._token[target]),
                             ("confidence", self._confidence)):
            binding.bind_output(name, "cpu", 0, buffer.dtype, list(buffer.shape), buffer.ctypes.data)
        return binding

    def _steps(self, token: int, depth: int) -> list[int]:
        """Up to `depth` guesses from the state in self._state[0] after `token`, stopping at the first unsure one."""
        self._token[0, 0] = token
        tokens: list[int] = []
        for step in range(depth):
            source, target = step % 2, 1 - step % 2
            if self._bindings is not None:
                self.session.run_with_iobinding(self._bindings[source])
            else:
                outputs = self.session.run(None, {"state": self._state[source], "token": self._token[source]})
                for buffer, value in zip((self._token[target], self._confidence, self._state[target]), outputs):
                    np.copyto(buffer, value.reshape(buffer.shape))
            if self._confidence[0] < self.floor:
                break
            tokens.append(int(self._token[target, 0]))
        return tokens

    def follow(self, hidden: np.ndarray | None) -> None:
        """The hidden row behind the logits the next root is chosen from (None: the step had none)."""
        if hidden is None:
            self.row = None
            return
        np.copyto(self._row[0], hidden)  # the next target step overwrites `hidden`
        self.row = self._row

    def propose(self, context: list[int], depth: int) -> Draft:
        if self.row is None or depth <= 0:
            return Draft()
        np.copyto(self._state[0], self.row)
        return Draft.chain(self._steps(context[-1], min(depth, self.depth)))

    def reset(self) -> None:
        self.row = None
