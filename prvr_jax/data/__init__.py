"""Data: release readers (`release`), preprocessing (`preprocess`), TFRecord preparation and pipelines."""
