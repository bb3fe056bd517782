"""Import-time stand-in for bitsandbytes on the lent GPU machine (not an installable package; no dist-info).

ColossalAI 0.5.0's `colossalai.nn.optimizer` imports galore_torch, whose GaLoreAdamW8bit (and ColossalAI's own
GaLore optimizers) subclass bitsandbytes' Optimizer2State at import time. The bitsandbytes wheel (76 MB) is larger
than one device call carries, and train.py never uses an 8-bit optimizer, so gpu/run.sh merges this folder into the
site (MERGE_SITE) beside the galore-torch wheel. transformers and peft look bitsandbytes up by its package metadata,
which this stand-in lacks, so they see it as absent.
"""
