# Shared by the framework programs: arguments, deterministic mode, and the
# lines every program prints (a loss per step that a run compares, a
# checkpoint a harness verifies the replica at, steps/s on stderr).
import os, sys, time

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
EVERY = int(os.environ.get("VGTEST_EVERY", "5"))
DETERMINISTIC = os.environ.get("VGTEST_DETERMINISTIC") == "1"


def torch_setup(seed=1234):
    import torch
    if DETERMINISTIC:
        torch.use_deterministic_algorithms(True, warn_only=True)  # ops with no deterministic kernel warn
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(seed)
    return torch.device("cuda")


class Steps:
    """Times a training loop: call tick(step, loss_fn) after each step."""

    def __init__(self):
        self.t0 = None
        self.n = 0
        self.paused = 0.0  # seconds a harness held the checkpoint: not the program's time

    def tick(self, step, loss):
        if step == 1:
            self.t0 = time.time()  # the first step compiles and loads: not timed
        if step >= 1:
            self.n += 1
        if step % EVERY == 0 or step == STEPS - 1:
            print(f"step {step} loss {loss():.6f}", flush=True)
        if step == STEPS // 2 and os.environ.get("VGTEST_CHECKPOINT"):
            print("checkpoint", flush=True)
            t = time.time()
            sys.stdin.readline()
            self.paused += time.time() - t

    def done(self, sync):
        sync()
        el = time.time() - self.t0 - self.paused if self.t0 else 0
        print(f"{self.n / el if el else 0:.2f} steps/s", file=sys.stderr, flush=True)
