"""After training: load a trained policy, watch it (enjoy), export it (ONNX, TorchScript), plot curves."""
