"""Evolution agents built on genesis-fp16."""

from genesis_fp16.base.packages import require_ours

# the agents import genesis-fp16's infrastructure (world model, replay buffer):
# a host project's own `infrastructure` first on sys.path is one clear error here
require_ours("infrastructure")
