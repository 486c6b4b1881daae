"""RLHF precision forensics: which component (policy, reference, reward,
value, KL) breaks first in reduced precision, measured against FP64.

See docs/FORENSICS.md. Phases: ``pretrain`` (the shared FP32 initial
checkpoint), ``probe``, ``freeze``, ``replay``, ``sweep``, ``analyze``.
"""
