"""After training: watch a trained policy (enjoy), export it (ONNX, TorchScript), plot learning curves. Loading a
policy is appo/learning/trained_policy.py (the evaluator uses it during training too)."""
