"""The one config (`ttft-exporter.yaml`) every stage reads: its types, every field with a
default (`settings`), and the loader that turns YAML or a dict into a validated config, naming
every mistake at once (`loader`)."""
