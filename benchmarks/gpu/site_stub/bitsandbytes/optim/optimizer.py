"""See bitsandbytes/__init__.py: the one name ColossalAI's and galore_torch's modules need when imported."""

import torch


class Optimizer2State(torch.optim.Optimizer):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("bitsandbytes is not installed here (an import-time stand-in): no 8-bit optimizers")
