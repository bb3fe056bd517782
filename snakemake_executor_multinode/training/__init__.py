"""What a training script imports from the plugin, inside the job: tracking (its curves to TensorBoard, W&B and MLflow,
one experiment across requeues). The plugin itself never imports it (docs/design.md)."""
