"""The precision part: the request (`request`: one typed value from where the user speaks), the one decision
(`decision`: request, device and measurement in, `PrecisionDecision` out; reads no ledger, settings or profile),
the mode table (`modes`), the plugins (`plugins`: one small class per mode that owns its autocast, scaler and
window hooks), what a device can run (`capability`, which tests patch), the measurement of ``auto`` and its host
cache (`measure`, `calibration`, `record`, `cache`) and the seed API's decision for a bare trainer (`bare`). It
imports nothing of the training or rollout parts (docs/ARCHITECTURE.md)."""
