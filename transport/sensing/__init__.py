"""What the transport senses of its path: the network signal and the estimator behind it.

- `aioquic_private`: every read of aioquic's private state, and the check that it still exists;
  the only module an aioquic upgrade changes.
- `filters`, `estimator`: the pure bottleneck-bandwidth estimator (delivery-rate samples, the
  app-limited rule, windowed max, loss window); no aioquic import.
- `congestion`: Reno and Cubic subclasses that feed the estimator, registered with aioquic.
- `signal`: `SignalReader` / `NetworkSignal`, the snapshot the policies consume.
"""
