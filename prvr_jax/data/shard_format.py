"""The shard folder's format: its manifest's name and version, and the error its readers and
writers raise. No TensorFlow here, so the validator (`check`) can name a shard folder without
importing the writer (`prepare`) or the reader (`pipeline`)."""

MANIFEST = 'manifest.json'
FORMAT = 'prvr_jax.shards'
FORMAT_VERSION = 1


class ShardError(ValueError):
  """A missing, stale or corrupted shard folder; the message names the file."""
